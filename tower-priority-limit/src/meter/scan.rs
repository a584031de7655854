//! The backward scan: finds the last `"usage"` object of a JSON body without parsing the rest,
//! since OpenAI and Anthropic put usage last.

use std::sync::LazyLock;

use memchr::memmem::FinderRev;

use super::usage::{skip_ws, Usage};

/// Finds the last `"usage"` key followed by `:` and an object with a
/// meaningful usage, tolerating whatever follows that object.
pub(crate) fn find_last_usage(buf: &[u8]) -> Option<Usage> {
    const KEY: &[u8] = b"\"usage\"";
    static REVERSE: LazyLock<FinderRev<'static>> = LazyLock::new(|| FinderRev::new(KEY));
    for at in REVERSE.rfind_iter(buf) {
        let rest = skip_ws(&buf[at + KEY.len()..]);
        let Some(rest) = rest.strip_prefix(b":") else {
            continue;
        };
        let rest = skip_ws(rest);
        if !rest.starts_with(b"{") {
            continue;
        }
        let mut stream = serde_json::Deserializer::from_slice(rest).into_iter::<Usage>();
        if let Some(Ok(usage)) = stream.next() {
            if usage.is_meaningful() {
                return Some(usage);
            }
        }
    }
    None
}
