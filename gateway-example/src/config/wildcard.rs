//! LiteLLM's wildcard routes, pure: a `model_name` holding `*` ([`Pattern`]) serves every name
//! it matches, and the parts its `*`s matched fill the `*`s of `litellm_params.model`
//! ([`substitute`]).
//!
//! As LiteLLM's `PatternMatchRouter`: each `*` matches any run of characters, as much as it can
//! (its regex's greedy `(.*)`); the parts go into the model's `*`s in order. Two differences, both
//! stricter: a pattern matches the whole name (LiteLLM's `re.match` anchors only at the start, so
//! `*-mini` would also take `gpt-4o-mini-2024` and cut it), and a name holding `*` is never
//! served through a pattern.

use std::borrow::Cow;

use smallvec::SmallVec;

/// A wildcard `model_name` (`openai/*`, `openai/gpt-*`, `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: Box<str>,
    /// The literal parts around the `*`s: one more than there are `*`s.
    parts: Box<[Box<str>]>,
}

/// The characters Python's `re.escape` escapes: LiteLLM measures a pattern by its regex.
const PY_ESCAPED: &str = "()[]{}?*+-|^$\\.&~# \t\n\r\x0b\x0c";
/// The characters LiteLLM counts as a regex's complexity.
const PY_COMPLEX: &str = "*+?\\^$|()";

impl Pattern {
    /// `model_name` as a pattern, or `None` when it holds no `*` (a plain name).
    pub fn parse(model_name: &str) -> Option<Self> {
        if !model_name.contains('*') {
            return None;
        }
        Some(Self {
            text: model_name.into(),
            parts: model_name.split('*').map(Box::from).collect(),
        })
    }

    /// The pattern as written (the group's name).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// How many `*`s it has.
    pub fn stars(&self) -> usize {
        self.parts.len() - 1
    }

    /// The parts of `name` its `*`s match, in order, or `None` when it does not match `name`
    /// whole (or `name` holds a `*`). Each `*` takes as much as it can, as a greedy regex does:
    /// the literal parts are placed from the right, each at its last possible place.
    pub fn captures<'n>(&self, name: &'n str) -> Option<SmallVec<[&'n str; 2]>> {
        if name.contains('*') {
            return None;
        }
        let (first, rest) = self.parts.split_first()?;
        let (last, middle) = rest.split_last()?;
        let start = first.len();
        if !name.starts_with(&**first) || name.len() < start + last.len() {
            return None;
        }
        if !name.ends_with(&**last) {
            return None;
        }
        let mut end = name.len() - last.len();
        // Where each middle part starts, found right to left.
        let mut at: SmallVec<[usize; 2]> = smallvec::smallvec![0; middle.len()];
        for (i, part) in middle.iter().enumerate().rev() {
            let found = name.get(start..end)?.rfind(&**part)? + start;
            at[i] = found;
            end = found;
        }
        let mut captures = SmallVec::with_capacity(self.stars());
        let mut from = start;
        for (i, part) in middle.iter().enumerate() {
            captures.push(&name[from..at[i]]);
            from = at[i] + part.len();
        }
        captures.push(&name[from..name.len() - last.len()]);
        Some(captures)
    }

    /// Whether it matches `name` whole.
    pub fn matches(&self, name: &str) -> bool {
        matches(&self.text, name)
    }

    /// LiteLLM's order of patterns (`PatternUtils.calculate_pattern_specificity`): the one
    /// whose regex (`re.escape(pattern)` with each `\*` made `(.*)`) is longer first, then the
    /// one with more regex syntax in it; sort by this, descending, keeping file order for ties.
    pub fn specificity(&self) -> (usize, usize) {
        let (mut len, mut complexity) = (0, 0);
        for c in self.text.chars() {
            if c == '*' {
                // `(.*)`: four characters, three of them counted.
                len += 4;
                complexity += 3;
            } else if PY_ESCAPED.contains(c) {
                len += 2;
                complexity += 1 + usize::from(PY_COMPLEX.contains(c));
            } else {
                len += 1;
            }
        }
        (len, complexity)
    }
}

/// Whether `pattern` (a name that may hold `*`s) allows `name`: the same name, or a pattern
/// that matches it whole as a wildcard route would (a key's `models: ["openai/*"]` allows
/// `openai/gpt-4o`). Without allocating: it is asked on every request of a key with a list.
pub fn allows(pattern: &str, name: &str) -> bool {
    pattern == name || (pattern.contains('*') && matches(pattern, name))
}

/// Whether wildcard `pattern` matches `name` whole (`name` without `*`): the literal parts placed
/// left to right, each at its first place after the one before (where it is placed changes
/// what the `*`s capture, not whether it matches).
fn matches(pattern: &str, name: &str) -> bool {
    if name.contains('*') {
        return false;
    }
    let Some((first, rest)) = pattern.split_once('*') else {
        return pattern == name;
    };
    let (middle, last) = rest.rsplit_once('*').unwrap_or(("", rest));
    if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
        return false;
    }
    let mut between = &name[first.len()..name.len() - last.len()];
    if !rest.contains('*') {
        return true;
    }
    for part in middle.split('*') {
        match between.find(part) {
            Some(at) => between = &between[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// `template` (a `litellm_params.model` after its provider) with its `*`s replaced by
/// `captures`, in order; as it is when it has no `*` (every matched name goes to that model).
/// The config guarantees a template has as many `*`s as its pattern, or none.
pub fn substitute<'t>(template: &'t str, captures: &[Box<str>]) -> Cow<'t, str> {
    if !template.contains('*') {
        return Cow::Borrowed(template);
    }
    let mut out =
        String::with_capacity(template.len() + captures.iter().map(|c| c.len()).sum::<usize>());
    let mut parts = template.split('*');
    out.push_str(parts.next().unwrap_or_default());
    for (i, part) in parts.enumerate() {
        out.push_str(captures.get(i).map_or("*", |c| c));
        out.push_str(part);
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(pattern: &str, name: &str) -> Option<Vec<String>> {
        Pattern::parse(pattern)
            .unwrap()
            .captures(name)
            .map(|c| c.into_iter().map(str::to_owned).collect())
    }

    #[test]
    fn a_plain_name_is_no_pattern() {
        assert_eq!(Pattern::parse("openai/gpt-4o"), None);
    }

    #[test]
    fn provider_and_prefix_patterns_capture_the_rest() {
        assert_eq!(caps("openai/*", "openai/gpt-4o").unwrap(), ["gpt-4o"]);
        assert_eq!(caps("openai/gpt-*", "openai/gpt-4o").unwrap(), ["4o"]);
        assert_eq!(caps("*", "anything/at all").unwrap(), ["anything/at all"]);
        assert_eq!(caps("openai/*", "openai/").unwrap(), [""]);
        assert_eq!(caps("openai/*", "anthropic/claude"), None);
        assert_eq!(caps("openai/gpt-*", "openai/o1"), None);
        assert_eq!(caps("openai/*", "openai"), None);
    }

    /// The whole name, not a prefix of it (LiteLLM's `re.match` would take a prefix).
    #[test]
    fn a_pattern_matches_the_whole_name() {
        assert_eq!(caps("*-mini", "gpt-4o-mini").unwrap(), ["gpt-4o"]);
        assert_eq!(caps("*-mini", "gpt-4o-mini-2024"), None);
        // The suffix and the prefix may not overlap.
        assert_eq!(caps("ab*ba", "aba"), None);
        assert_eq!(caps("ab*ba", "abba").unwrap(), [""]);
    }

    /// As a greedy regex: the first `*` takes as much as it can.
    #[test]
    fn several_stars_are_greedy_from_the_left() {
        // LiteLLM's own example: `fo::*::static::*`.
        assert_eq!(
            caps("fo::*::static::*", "fo::hi::static::there").unwrap(),
            ["hi", "there"]
        );
        assert_eq!(caps("*-*", "a-b-c").unwrap(), ["a-b", "c"]);
        assert_eq!(caps("**", "abc").unwrap(), ["abc", ""]);
        assert_eq!(caps("x*y*z", "xayybz").unwrap(), ["ay", "b"]);
        assert_eq!(caps("x*y*z", "xz"), None);
    }

    /// Matching without captures agrees with `captures`; `allows` takes plain names as they are.
    #[test]
    fn allows_is_matching_without_captures() {
        let names = [
            "openai/gpt-4o",
            "openai/",
            "openai",
            "gpt-4o-mini",
            "gpt-4o-mini-2024",
            "aba",
            "abba",
            "fo::hi::static::there",
            "a-b-c",
            "xayybz",
            "xz",
            "",
            "openai/*",
        ];
        let patterns = [
            "openai/*",
            "openai/gpt-*",
            "*",
            "*-mini",
            "ab*ba",
            "fo::*::static::*",
            "*-*",
            "**",
            "x*y*z",
            "*a*",
            "a*b*c*d",
        ];
        for p in patterns {
            let pattern = Pattern::parse(p).unwrap();
            for n in names {
                assert_eq!(matches(p, n), pattern.captures(n).is_some(), "{p} on {n}");
            }
        }
        assert!(allows("openai/gpt-4o", "openai/gpt-4o"));
        assert!(!allows("openai/gpt-4o", "openai/gpt-5"));
        // A pattern allows itself by name (a key allowed `openai/*` may see the route listed).
        assert!(allows("openai/*", "openai/*"));
        assert!(!allows("openai/gpt-4o", "openai/*"));
    }

    #[test]
    fn a_name_holding_a_star_is_not_served_through_a_pattern() {
        assert_eq!(caps("openai/*", "openai/*"), None);
        assert_eq!(caps("*", "gpt-*"), None);
    }

    /// LiteLLM's measure: `openai/gpt-*` → `openai/gpt\-(.*)`: 16 characters, `\`, `(`, `*`,
    /// `)` counted.
    #[test]
    fn specificity_is_litellms() {
        let s = |p: &str| Pattern::parse(p).unwrap().specificity();
        assert_eq!(s("openai/gpt-*"), (16, 4));
        assert_eq!(s("openai/*"), (11, 3));
        assert_eq!(s("*"), (4, 3));
        // `.` and `-` are escaped, not counted; `+` is both.
        assert_eq!(s("a.b+*"), (10, 6));
        assert!(s("openai/gpt-*") > s("openai/*"));
        assert!(s("openai/*") > s("*"));
    }

    /// A greedy regex's answer, by backtracking: each `*` tries its longest capture first.
    fn reference(parts: &[&str], name: &str) -> Option<Vec<String>> {
        let (first, rest) = parts.split_first()?;
        let after = name.strip_prefix(first)?;
        if rest.is_empty() {
            return after.is_empty().then(Vec::new);
        }
        (0..=after.len()).rev().find_map(|len| {
            let mut more = reference(rest, &after[len..])?;
            more.insert(0, after[..len].to_owned());
            Some(more)
        })
    }

    proptest::proptest! {
        /// Captures are a greedy regex's (`^p0(.*)p1(.*)…$`), filling the pattern's `*`s with
        /// them gives the name back, and matching without captures agrees.
        #[test]
        fn captures_are_a_greedy_regexs(pattern in "[ab*-]{0,6}", name in "[ab-]{0,8}") {
            let Some(p) = Pattern::parse(&pattern) else { return Ok(()) };
            let parts: Vec<&str> = pattern.split('*').collect();
            let got = p.captures(&name).map(|c| c.into_iter().map(str::to_owned).collect::<Vec<_>>());
            proptest::prop_assert_eq!(&got, &reference(&parts, &name));
            proptest::prop_assert_eq!(matches(&pattern, &name), got.is_some());
            if let Some(c) = got {
                let c: Vec<Box<str>> = c.into_iter().map(Box::from).collect();
                proptest::prop_assert_eq!(substitute(&pattern, &c), name.as_str());
            }
        }
    }

    #[test]
    fn templates_take_the_parts_in_order() {
        let c: Vec<Box<str>> = vec!["hi".into(), "there".into()];
        assert_eq!(substitute("fo::*::static::*", &c), "fo::hi::static::there");
        assert_eq!(substitute("*", &c[..1]), "hi");
        assert!(matches!(substitute("fixed", &c), Cow::Borrowed("fixed")));
    }
}
