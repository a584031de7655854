# Hand-written texts the corpus generator (`generate.py`) draws from. Written for this corpus;
# the code and long English contexts come from this repository's own files instead (see
# `generate.py`).

SYSTEM_SHORT = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer in at most three sentences.",
    "You are ChatBot, a friendly support agent for Acme Cloud. Be polite and brief.",
    "You are an expert Rust programmer. Prefer idiomatic, safe code.",
    "Reply in JSON only.",
    "You translate the user's text into English. Output the translation only.",
]

SHORT_QUESTIONS = [
    "What's the capital of Australia?",
    "How do I reverse a list in Python?",
    "Write a haiku about autumn rain.",
    "Summarize the plot of Hamlet in two sentences.",
    "What is the difference between TCP and UDP?",
    "Can you explain what a mutex is, like I'm five?",
    "Give me three names for a bakery that sells sourdough.",
    "Is 1,000,003 a prime number?",
    "Convert 72 degrees Fahrenheit to Celsius.",
    "What does HTTP status 429 mean and how should a client react?",
    "Suggest a good book about distributed systems for a beginner.",
    "How many tokens is a typical English word?",
    "Fix the grammar: 'Me and him goes to the store yesterday.'",
    "What's a good name for a cat who likes to sit on keyboards? 🐱⌨️",
    "Explain the CAP theorem in one paragraph.",
    "Draft a polite email declining a meeting on Friday at 3pm.",
    "What time zone is Tokyo in, and what's the offset from UTC?",
    "Write a regex that matches an ISO 8601 date like 2024-03-15.",
    "Why is the sky blue?",
    "I have eggs, spinach, feta and half an onion. What can I cook in 15 minutes?",
    "List the planets in order from the sun.",
    "How do I undo the last git commit but keep the changes?",
    "What's the derivative of x^3 * sin(x)?",
    "Give me a 5-item packing list for a weekend hiking trip ⛰️",
    "Translate 'good morning, how did you sleep?' into Spanish.",
    "What are the main side effects of ibuprofen?",
    "In SQL, what's the difference between WHERE and HAVING?",
    "Recommend a stretching routine for someone who sits all day.",
    "Explain exponential backoff with jitter.",
    "Who painted 'The Night Watch'?",
    "Rewrite this more formally: 'hey, the server's down again, can u check?'",
    "What is a token bucket rate limiter?",
    "Tell me a joke about programmers and coffee ☕",
    "How long should I boil a soft-boiled egg?",
    "What's the time complexity of quicksort in the worst case, and why?",
    "Classify the sentiment of: 'The update broke everything and support never replied.'",
    "Generate a strong password policy for a small company (bullet points).",
    "What's the population of Canada, roughly?",
    "How do I center a div horizontally and vertically with CSS?",
    "Explain the difference between a process and a thread.",
]

SHORT_ANSWERS = [
    "Canberra is the capital of Australia.",
    "Use `my_list.reverse()` to reverse in place, or `my_list[::-1]` to get a reversed copy.",
    "Rain taps the window,\nmaple leaves drift on puddles,\nthe kettle whistles.",
    "Prince Hamlet seeks revenge on his uncle Claudius, who murdered Hamlet's father and married his mother. His hesitation and feigned madness lead to a tragic chain of deaths, including his own.",
    "TCP is connection-oriented and guarantees ordered, reliable delivery with retransmissions and flow control; UDP is connectionless, has no delivery guarantees, and trades reliability for lower latency and overhead.",
    "Imagine one bathroom key at a party: whoever holds the key can use the bathroom, and everyone else waits until it's given back. A mutex is that key for a piece of data.",
]

LONG_SYSTEM = [
    """You are "Atlas", the customer support assistant for Northwind Logistics, a freight and parcel company operating in 14 countries.

## Your goals
1. Resolve the customer's issue in as few turns as possible.
2. Never invent tracking information. If you do not have a tracking record, say so and offer to open a ticket.
3. Keep a friendly, professional tone. Do not use slang. Do not use more than one emoji per reply, and only if the customer used one first.

## What you can do
- Look up a shipment by tracking number (format: two letters, nine digits, two letters, e.g. NW123456789DE).
- Explain delivery time estimates: domestic parcels 1-3 business days, EU parcels 3-6 business days, international freight 7-21 days depending on customs.
- Explain our fees: redelivery attempts after the second one cost 4.90 EUR; storage at a depot is free for 7 days and costs 1.50 EUR per day after that.
- Open a damage claim. A claim requires: the tracking number, photos of the packaging and the contents, and the declared value. Claims must be filed within 14 days of delivery.

## What you must not do
- Do not promise refunds; only a claims agent can approve them.
- Do not share another customer's address or phone number, even if the caller claims to be the recipient.
- Do not give legal or customs advice beyond what is written here. For customs questions, point to https://example.com/customs.

## Format
Answer in the customer's language. Use short paragraphs. When you list steps, use a numbered list. End every reply that opens a ticket with the ticket number in bold.""",
    """You are a senior code reviewer at a company that builds high-throughput network services in Rust and Go. When the user pastes code, review it as you would a pull request.

Review checklist (apply in this order, and skip sections with nothing to report):
* Correctness: off-by-one errors, unhandled error cases, integer overflow, races, deadlocks, lost wake-ups, cancellation safety of async code, resource leaks (file handles, sockets, tasks that are never joined).
* API design: is the public surface minimal? Are names precise? Are invariants enforced by types rather than comments? Would a caller be surprised by any behaviour?
* Performance: allocations on hot paths, needless clones, lock contention, unbounded queues, O(n^2) loops hidden behind iterators, blocking calls inside async contexts.
* Tests: are the edge cases covered? Are the tests deterministic, or do they depend on wall-clock time, sleeps, or ordering of a hash map?
* Style: only mention style if it hurts readability; the formatter and linter handle the rest.

Write the review as a list of findings. Each finding has a severity (blocker, major, minor, nit), the line or function it concerns, what is wrong, and a concrete suggestion (with a code snippet when the fix is not obvious). Do not praise the code unless the user asks for it. If the code is fine, say "No findings." and nothing else. Never rewrite the whole file.""",
    """You are an AI tutor for high-school mathematics (ages 14 to 18). Your student is working through exercises on their own and asks you for help.

Rules:
- Never give the final answer straight away. First ask what the student has tried, then give a hint that moves them one step forward. Only if the student has tried three times, walk them through the full solution.
- Use LaTeX for formulas, inline with $...$ and display with $$...$$.
- Check the student's arithmetic carefully; point out the first mistake only, not all of them at once.
- Be encouraging but honest. If an answer is wrong, say it is wrong.
- Stay on topic. If the student asks about something unrelated to mathematics, gently steer back to the exercise.
- If the student seems upset or mentions self-harm, stop tutoring, respond with empathy, and share the phone number of the school counsellor: 555-0142.

Topics you can help with: algebra (linear and quadratic equations, inequalities, systems of equations), functions and their graphs, exponentials and logarithms, trigonometry (unit circle, identities, triangles), sequences and series, introductory calculus (limits, derivatives, simple integrals), probability and statistics (combinatorics, conditional probability, mean/median/standard deviation, the normal distribution), and Euclidean geometry.

When the student uploads a photo of handwritten work, transcribe it first and ask them to confirm the transcription before you comment on it.""",
    """You are a data extraction engine. You receive the raw text of an invoice (OCR output, possibly with errors) and return a single JSON object, with no prose before or after it, matching this schema:

{
  "invoice_number": string,
  "issue_date": string (ISO 8601 date, YYYY-MM-DD),
  "due_date": string or null,
  "currency": string (ISO 4217 code, e.g. "EUR"),
  "seller": {"name": string, "vat_id": string or null, "address": string},
  "buyer": {"name": string, "vat_id": string or null, "address": string},
  "lines": [{"description": string, "quantity": number, "unit_price": number, "vat_rate": number, "total": number}],
  "subtotal": number,
  "vat_total": number,
  "total": number
}

Rules:
1. Numbers use a dot as the decimal separator, no thousands separators: "1.234,50" becomes 1234.5.
2. If a field cannot be found, use null, never an empty string. Never guess a VAT ID.
3. Dates written as 03/04/2024 are ambiguous: use the seller's country to decide (day first in Europe, month first in the US). If the country is unknown, use null and add the raw string to "notes".
4. Check that the line totals add up to the subtotal and that subtotal + vat_total = total, within 0.01. If they do not, add a field "warnings": [string] explaining the mismatch; do not silently fix the numbers.
5. OCR often confuses O and 0, l and 1, S and 5 inside numbers: fix those only inside numeric fields.
6. Output must be valid JSON parseable by a strict parser: double quotes, no trailing commas, no comments.""",
    """# Role
You are the in-app assistant of "Ledgerly", a personal finance application. Users ask about their spending, budgets and accounts. You have read-only access to the user's data through the tools provided; you cannot move money.

# Tone
Plain, calm and non-judgemental. Never shame the user about spending. Avoid jargon; if you must use a term like "APR" or "amortization", explain it in one short sentence.

# Privacy
- Only discuss the data of the signed-in user.
- Do not reveal full account numbers; show only the last four digits (e.g. "•••• 4821").
- If the user asks you to remember something sensitive (passwords, PINs, security answers), refuse and explain that Ledgerly never stores these in chat.

# Money
- Amounts are in the account's currency; format them with the user's locale (the locale is given in the first system message).
- When you compute totals over a period, state the period explicitly ("from 1 to 31 March").
- Round to two decimals only at the end of a calculation.
- If transactions are pending, say whether your totals include them (by default they do not).

# Limits
You are not a financial adviser. For questions about investments, taxes or debt restructuring, give general educational information only and suggest talking to a licensed professional. Never recommend specific securities.

# Output
Use short paragraphs and, for comparisons, a small Markdown table with at most 5 rows. Charts are rendered by the app: to request one, end your reply with a line `CHART: <type> <metric> <period>`, for example `CHART: bar spending_by_category last_3_months`.""",
]

PYTHON_SNIPPETS = [
    '''import asyncio
import random

import httpx


async def fetch_with_retry(client: httpx.AsyncClient, url: str, attempts: int = 5) -> dict:
    delay = 0.5
    for attempt in range(attempts):
        try:
            resp = await client.get(url, timeout=10.0)
            if resp.status_code == 429:
                retry_after = float(resp.headers.get("retry-after", delay))
                await asyncio.sleep(retry_after)
                continue
            resp.raise_for_status()
            return resp.json()
        except httpx.TransportError:
            await asyncio.sleep(delay + random.random() * delay)
            delay = min(delay * 2, 30)
    raise RuntimeError(f"giving up on {url} after {attempts} attempts")


async def main(urls):
    async with httpx.AsyncClient() as client:
        results = await asyncio.gather(*(fetch_with_retry(client, u) for u in urls))
    for url, data in zip(urls, results):
        print(url, len(data))


if __name__ == "__main__":
    asyncio.run(main(["https://example.com/a", "https://example.com/b"]))
''',
    '''def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals.

    >>> merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]])
    [[1, 6], [8, 10], [15, 18]]
    """
    if not intervals:
        return []
    intervals.sort(key=lambda x: x[0])
    merged = [intervals[0]]
    for start, end in intervals[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return merged


class LRUCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.data = {}

    def get(self, key):
        if key not in self.data:
            return -1
        value = self.data.pop(key)
        self.data[key] = value
        return value

    def put(self, key, value):
        if key in self.data:
            self.data.pop(key)
        elif len(self.data) >= self.capacity:
            self.data.pop(next(iter(self.data)))
        self.data[key] = value
''',
]

JS_SNIPPETS = [
    '''import { useEffect, useState } from "react";

export function useDebouncedSearch(query, delay = 300) {
  const [results, setResults] = useState([]);
  const [loading, setLoading] = useState(false);
  const [error, setError] = useState(null);

  useEffect(() => {
    if (!query.trim()) {
      setResults([]);
      return;
    }
    const controller = new AbortController();
    const handle = setTimeout(async () => {
      setLoading(true);
      try {
        const res = await fetch(`/api/search?q=${encodeURIComponent(query)}`, {
          signal: controller.signal,
        });
        if (!res.ok) throw new Error(`HTTP ${res.status}`);
        const body = await res.json();
        setResults(body.items ?? []);
        setError(null);
      } catch (e) {
        if (e.name !== "AbortError") setError(e);
      } finally {
        setLoading(false);
      }
    }, delay);
    return () => {
      clearTimeout(handle);
      controller.abort();
    };
  }, [query, delay]);

  return { results, loading, error };
}
''',
    '''SELECT c.customer_id,
       c.name,
       COUNT(o.order_id)                      AS orders,
       SUM(o.total_cents) / 100.0             AS revenue,
       MAX(o.created_at)                      AS last_order,
       AVG(o.total_cents) FILTER (WHERE o.status = 'refunded') / 100.0 AS avg_refund
FROM customers c
LEFT JOIN orders o
       ON o.customer_id = c.customer_id
      AND o.created_at >= now() - interval '90 days'
WHERE c.country IN ('DE', 'FR', 'NL')
GROUP BY c.customer_id, c.name
HAVING COUNT(o.order_id) > 3
ORDER BY revenue DESC NULLS LAST
LIMIT 50;
''',
]

CODE_ASKS = [
    "Can you review this code? Point out bugs first.",
    "Explain what this does, step by step.",
    "Write unit tests for this.",
    "This is too slow on large inputs. How can I speed it up?",
    "Refactor this to be more readable without changing behaviour.",
    "Is there a race condition here?",
    "Add doc comments to the public items.",
    "Port this to TypeScript.",
]

CHINESE = [
    "请帮我写一封邮件，告诉客户我们的发货会推迟一周，原因是供应商的原材料短缺。语气要礼貌，并提出给他们九五折的补偿。",
    "人工智能的发展给教育带来了很多变化。一方面，学生可以随时获得个性化的辅导，学习效率明显提高；另一方面，老师们担心学生过度依赖工具，失去独立思考的能力。请你从正反两方面分析这个问题，并给出你的建议，字数在五百字左右。",
    "我在学习 Rust，遇到了一个问题：为什么在 async 函数里持有 MutexGuard 跨越 await 点会导致编译错误？能不能用简单的例子解释一下 Send 和 Sync 的区别？",
    "北京今天的天气怎么样？如果下雨的话，推荐几个适合带孩子去的室内景点，最好交通方便，门票不要太贵。",
    "以下是我们公司上个季度的销售数据：华东地区销售额为 1,250 万元，同比增长 12%；华南地区为 980 万元，同比下降 3%；华北地区为 760 万元，同比增长 8%。请帮我写一段简短的分析，并指出下个季度应该重点关注的地区。",
    "床前明月光，疑是地上霜。举头望明月，低头思故乡。请解释这首诗的意境，并把它翻译成英文，保留诗的韵味。",
    "你好！我想了解一下在上海租房需要注意哪些事项，比如押金、合同期限、中介费，以及如何避免遇到黑中介。",
    "请把下面这段话改写得更正式一些：我们这个项目搞得差不多了，下周应该就能上线，到时候大家再看看有没有啥问题。",
]

JAPANESE = [
    "来週の月曜日に取引先との会議があります。プレゼンテーションの構成を考えてください。テーマは「新しい在庫管理システムの導入による業務効率化」で、時間は二十分です。",
    "日本の四季について、外国人観光客向けに簡単に紹介する文章を書いてください。春の桜、夏の祭り、秋の紅葉、冬の雪景色に触れてください。",
    "このエラーメッセージの意味を教えてください：「thread 'main' panicked at 'called `Option::unwrap()` on a `None` value'」。どう修正すればいいですか？",
    "東京から京都まで新幹線で行く場合、どのくらい時間がかかりますか？また、のぞみとひかりの違いは何ですか？",
    "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。何でも薄暗いじめじめした所でニャーニャー泣いていた事だけは記憶している。この冒頭の文体の特徴を説明してください。",
]

KOREAN = [
    "안녕하세요! 다음 주에 부산으로 2박 3일 여행을 가려고 하는데, 꼭 가봐야 할 관광지와 맛집을 추천해 주세요. 해운대와 감천문화마을은 이미 알고 있어요.",
    "회의록을 요약해 주세요. 오늘 회의에서는 신제품 출시 일정을 3월에서 4월로 연기하기로 결정했고, 마케팅 예산은 15% 증액하기로 했습니다. 다음 회의는 금요일 오후 2시입니다.",
    "파이썬에서 리스트와 튜플의 차이점이 무엇인가요? 언제 어떤 것을 사용하는 것이 좋은지 예시와 함께 설명해 주세요.",
]

ACCENTED = [
    ("fr", "Bonjour ! Pourriez-vous m'aider à rédiger une lettre de motivation pour un poste d'ingénieure logicielle à Lyon ? J'ai cinq ans d'expérience en développement back-end, principalement en Java et en Go, et je souhaite mettre en avant mon goût pour la qualité du code et le travail en équipe. Le ton doit être professionnel mais chaleureux."),
    ("fr", "Explique-moi la différence entre l'imparfait et le passé composé, avec des exemples de la vie quotidienne. J'ai toujours du mal à choisir quand je raconte ce que j'ai fait le week-end dernier."),
    ("de", "Könnten Sie mir bitte erklären, wie die Mülltrennung in Deutschland funktioniert? Ich bin gerade nach München gezogen und weiß nicht, was in die gelbe Tonne, die Biotonne und die Papiertonne gehört. Außerdem: Wo gebe ich Pfandflaschen zurück?"),
    ("de", "Schreibe eine kurze Zusammenfassung des folgenden Textes: Die Energiewende stellt Deutschland vor große Herausforderungen. Der Ausbau der Windkraft an Land stockt, während der Strombedarf durch Wärmepumpen und Elektroautos steigt. Gleichzeitig müssen die Übertragungsnetze von Nord nach Süd erweitert werden, was auf Widerstand in der Bevölkerung stößt."),
    ("es", "¿Cuál es la mejor manera de aprender a programar si tengo cuarenta años y nunca he escrito una línea de código? Trabajo en contabilidad y me gustaría automatizar tareas con hojas de cálculo. ¿Por dónde empiezo: Python, JavaScript o macros de Excel?"),
    ("es", "Redacta un mensaje para mis vecinos explicando que el próximo sábado habrá una reunión de la comunidad a las once de la mañana en el portal, para hablar de la reparación del ascensor y de la instalación de placas solares en la azotea."),
    ("pt", "Olá! Estou a planear uma viagem a Portugal em outubro. Quantos dias devo ficar em Lisboa e no Porto? Também gostaria de visitar Sintra e o Douro. Podes sugerir um itinerário de dez dias, com transportes públicos?"),
    ("pl", "Cześć! Czy możesz wyjaśnić, jak działa podatek od towarów i usług dla jednoosobowej działalności gospodarczej w Polsce? Zastanawiam się, czy powinienem zarejestrować się jako czynny podatnik VAT, skoro moje przychody są niższe niż próg zwolnienia."),
    ("vi", "Xin chào! Bạn có thể giải thích cho tôi sự khác nhau giữa học máy và học sâu không? Tôi là sinh viên năm nhất ngành công nghệ thông tin và muốn biết nên bắt đầu học từ đâu."),
    ("ru", "Здравствуйте! Помогите, пожалуйста, составить план подготовки к собеседованию на позицию бэкенд-разработчика. Особенно меня интересуют вопросы по базам данных, индексам и транзакциям, а также по проектированию распределённых систем."),
    ("ru", "Переведи на английский: «Мы получили ваше письмо и рассмотрим заявку в течение пяти рабочих дней. Если у вас возникнут вопросы, пожалуйста, свяжитесь с нашей службой поддержки по телефону»."),
    ("tr", "Merhaba! İstanbul'da üç gün geçireceğim. Tarihi yarımadada görülmesi gereken yerler nelerdir? Ayrıca Boğaz turu için en uygun saat hangisidir ve bilet fiyatları yaklaşık ne kadardır?"),
]

# Tool definitions in the chat-completions shape.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city and country, e.g. San Francisco, US"},
            "unit": {"type": "string", "description": "The temperature unit to use.", "enum": ["celsius", "fahrenheit"]},
        }, "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search_documents",
        "description": "Full-text search over the company knowledge base. Returns the best matching passages with their document ids.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "Search terms, in natural language."},
            "top_k": {"type": "integer", "description": "How many passages to return (1-20)."},
            "collection": {"type": "string", "description": "Which collection to search.", "enum": ["policies", "engineering", "sales", "hr"]},
        }, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "run_sql",
        "description": "Run a read-only SQL query against the analytics warehouse (PostgreSQL dialect). Queries that modify data are rejected.",
        "parameters": {"type": "object", "properties": {
            "sql": {"type": "string", "description": "A single SELECT statement."},
            "timeout_s": {"type": "number", "description": "Query timeout in seconds; defaults to 30."},
        }, "required": ["sql"]}}},
    {"type": "function", "function": {
        "name": "create_calendar_event",
        "description": "Create an event in the user's calendar.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string", "description": "Short title of the event."},
            "start": {"type": "string", "description": "Start time, ISO 8601 with offset."},
            "end": {"type": "string", "description": "End time, ISO 8601 with offset."},
            "attendees": {"type": "array", "description": "Email addresses of the attendees.", "items": {"type": "string"}},
            "reminder": {"type": "object", "description": "When to remind the user.", "properties": {
                "minutes_before": {"type": "integer", "description": "Minutes before the start."},
                "method": {"type": "string", "description": "How to remind.", "enum": ["popup", "email"]},
            }},
        }, "required": ["title", "start", "end"]}}},
    {"type": "function", "function": {
        "name": "send_email",
        "description": "Send an email on behalf of the user. Always confirm with the user before calling this.",
        "parameters": {"type": "object", "properties": {
            "to": {"type": "string", "description": "Recipient address."},
            "subject": {"type": "string", "description": "Subject line."},
            "body": {"type": "string", "description": "Plain-text body."},
            "priority": {"type": "string", "description": "Delivery priority.", "enum": ["low", "normal", "high"]},
        }, "required": ["to", "subject", "body"]}}},
    {"type": "function", "function": {
        "name": "get_order_status",
        "description": "Look up an order by its id and return its status, items and tracking number.",
        "parameters": {"type": "object", "properties": {
            "order_id": {"type": "string", "description": "The order id, e.g. ORD-2024-000123."},
        }, "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "convert_currency",
        "description": "Convert an amount between currencies at today's reference rate.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "description": "The amount to convert."},
            "from": {"type": "string", "description": "ISO 4217 code of the source currency."},
            "to": {"type": "string", "description": "ISO 4217 code of the target currency."},
        }, "required": ["amount", "from", "to"]}}},
    {"type": "function", "function": {
        "name": "book_meeting_room",
        "description": "Book a meeting room in one of the offices.",
        "parameters": {"type": "object", "properties": {
            "office": {"type": "string", "description": "Office location.", "enum": ["berlin", "paris", "new_york", "singapore"]},
            "capacity": {"type": "integer", "description": "Minimum number of seats."},
            "date": {"type": "string", "description": "Date, YYYY-MM-DD."},
            "from_time": {"type": "string", "description": "Start, HH:MM local time."},
            "to_time": {"type": "string", "description": "End, HH:MM local time."},
            "equipment": {"type": "array", "description": "Needed equipment.", "items": {"type": "string", "enum": ["projector", "whiteboard", "video_call"]}},
        }, "required": ["office", "date", "from_time", "to_time"]}}},
]

TOOL_TURNS = [
    ("What's the weather like in Paris right now?", "get_current_weather", {"location": "Paris, FR", "unit": "celsius"},
     {"temperature": 14, "unit": "celsius", "conditions": "light rain", "humidity": 82, "wind_kph": 17},
     "It's 14 °C in Paris with light rain, 82 % humidity and a 17 km/h wind. Take an umbrella."),
    ("How many active customers did we have in Germany last month?", "run_sql",
     {"sql": "SELECT COUNT(DISTINCT customer_id) FROM orders WHERE country = 'DE' AND created_at >= date_trunc('month', now()) - interval '1 month' AND created_at < date_trunc('month', now())"},
     {"rows": [{"count": 18342}], "elapsed_ms": 412},
     "You had 18,342 distinct customers with at least one order in Germany last month."),
    ("Where is my order ORD-2024-004512?", "get_order_status", {"order_id": "ORD-2024-004512"},
     {"status": "shipped", "items": [{"sku": "KB-84", "name": "Mechanical keyboard", "qty": 1}, {"sku": "MS-12", "name": "Wireless mouse", "qty": 2}], "carrier": "DHL", "tracking": "JD014600003828391045", "eta": "2024-05-17"},
     "Your order has shipped with DHL (tracking JD014600003828391045) and should arrive on 17 May."),
    ("What does our travel policy say about business class on long flights?", "search_documents", {"query": "business class long-haul flights travel policy", "collection": "policies", "top_k": 3},
     {"passages": [{"doc": "POL-017", "text": "Business class may be booked for flights with a scheduled duration of more than 8 hours, or for overnight flights followed by a customer meeting the same day. Approval by a director is required."}, {"doc": "POL-017", "text": "Premium economy is the default for flights between 4 and 8 hours."}]},
     "Per policy POL-017, business class is allowed on flights over 8 hours, or overnight flights followed by a same-day customer meeting, with a director's approval. Premium economy is the default for 4-8 hour flights."),
    ("How much is 250 dollars in euros?", "convert_currency", {"amount": 250, "from": "USD", "to": "EUR"},
     {"amount": 231.45, "currency": "EUR", "rate": 0.9258, "as_of": "2024-05-14"},
     "250 USD is about 231.45 EUR at today's reference rate (0.9258)."),
    ("Book a room for 6 people in Berlin tomorrow from 10 to 11:30, with a video call setup.", "book_meeting_room",
     {"office": "berlin", "capacity": 6, "date": "2024-05-15", "from_time": "10:00", "to_time": "11:30", "equipment": ["video_call"]},
     {"booked": True, "room": "Spree 3.04", "confirmation": "BR-88213"},
     "Done: room Spree 3.04 is booked for tomorrow 10:00-11:30 (confirmation BR-88213)."),
]

MULTI_TURN_USER = [
    "I'm planning to migrate our monolith to microservices. Where should I start?",
    "We have about 40 engineers and the monolith is a Django app with a single PostgreSQL database.",
    "Which part would you extract first: billing, notifications or search?",
    "How do we keep data consistent between the new service and the monolith during the transition?",
    "What about reporting queries that join across billing and user tables?",
    "Can you sketch the rollout plan as a timeline?",
    "What metrics should we watch to know if it's going well?",
    "Thanks! One last thing: how do I convince management this is worth the cost?",
    "Ok, and what if the team is split on using gRPC vs REST between services?",
    "Summarize everything we discussed in ten bullet points.",
]
