//! What decoding an upstream's gzip answer costs per request, counted by
//! `benches/decode_callgrind.sh` (instructions under callgrind, so a busy machine does not move
//! it): `N` answers, each an OpenAI-shaped JSON answer (non-streamed) or a stream of 50 SSE
//! chunks in 50 frames (streamed), gzip-encoded as nginx's `gzip on` sends them (level 1, one
//! sync flush per frame for the stream), read through `upstream_client::DecodedBody`; or, with
//! `identity`, the same bodies unencoded through the same type (its pass-through). The
//! difference per answer is what decoding adds.
//!
//! `cargo run --release -p benches --example decode_cost -- gzip|identity false|true N`

use std::collections::VecDeque;
use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use http_body::{Body, Frame};
use upstream_client::{BodyError, ContentCoding, DecodedBody};

/// A body of frames already there.
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = BodyError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// The answer's frames as the upstream sends them, unencoded.
fn answer(stream: bool) -> Vec<Vec<u8>> {
    if !stream {
        let json = r#"{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion","created":1741569952,"model":"gpt-4.1-2025-04-14","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I assist you today? If you have a question about your reading club or anything else, just ask.","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_fc9f1d7035"}"#;
        return vec![json.as_bytes().to_vec()];
    }
    let mut frames: Vec<Vec<u8>> = (0..50)
        .map(|i| {
            format!(
                "data: {{\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4.1-2025-04-14\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"word{i} \"}},\"finish_reason\":null}}]}}\n\n"
            )
            .into_bytes()
        })
        .collect();
    frames.push(b"data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":19,\"completion_tokens\":50,\"total_tokens\":69}}\n\ndata: [DONE]\n\n".to_vec());
    frames
}

/// `frames` gzip-encoded, one sync flush per frame (as nginx flushes a proxied stream).
fn gzip(frames: &[Vec<u8>]) -> Vec<Bytes> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    let mut out = Vec::new();
    for (i, frame) in frames.iter().enumerate() {
        encoder.write_all(frame).unwrap();
        if i + 1 == frames.len() {
            let last = encoder.finish().unwrap();
            out.push(Bytes::from(last));
            return out;
        }
        encoder.flush().unwrap();
        out.push(Bytes::from(std::mem::take(encoder.get_mut())));
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let coding = match args.get(1).map(String::as_str) {
        Some("identity") => ContentCoding::Identity,
        _ => ContentCoding::Gzip,
    };
    let stream = args.get(2).is_some_and(|s| s == "true");
    let n: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let plain = answer(stream);
    let wire: Vec<Bytes> = match coding {
        ContentCoding::Identity => plain.iter().map(|f| Bytes::from(f.clone())).collect(),
        _ => gzip(&plain),
    };
    let expected: usize = plain.iter().map(Vec::len).sum();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut total = 0;
    for _ in 0..n {
        let mut body = DecodedBody::new(Frames(wire.iter().cloned().collect()), coding);
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            total += frame.unwrap().into_data().unwrap().len();
        }
    }
    assert_eq!(total, expected * n, "every answer decoded whole");
}
