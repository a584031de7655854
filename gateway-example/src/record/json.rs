//! A record line as JSON, written by hand: the same bytes `serde_json::to_writer` writes for a
//! [`RecordLine`] (field order, omitted fields, string escapes), tested against it, at a
//! fraction of its cost (the writer's largest per line; `benches/RESULTS.md`, "Recording").

use super::line::RecordLine;

impl RecordLine {
    /// Appends the line's JSON object to `out` (no newline).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        // `time_ms` always comes first: every other member follows a comma.
        out.extend_from_slice(b"{\"time_ms\":");
        number(out, self.time_ms);
        if let Some(gateway) = &self.gateway {
            member(out, b",\"gateway\":", gateway);
        }
        member(out, b",\"model\":", &self.model);
        if let Some(name) = &self.name {
            member(out, b",\"name\":", name);
        }
        member(out, b",\"endpoint\":", &self.endpoint);
        member(out, b",\"key\":", &self.key);
        if let Some(team) = &self.team {
            member(out, b",\"team\":", team);
        }
        if let Some(priority) = &self.priority {
            member(out, b",\"priority\":", priority);
        }
        out.extend_from_slice(b",\"flow\":");
        number(out, self.flow);
        out.extend_from_slice(b",\"prompt_tokens\":");
        number(out, self.prompt_tokens);
        if let Some(n) = self.max_tokens {
            out.extend_from_slice(b",\"max_tokens\":");
            number(out, n);
        }
        if let Some(n) = self.max_wait_ms {
            out.extend_from_slice(b",\"max_wait_ms\":");
            number(out, n);
        }
        out.extend_from_slice(match self.stream {
            true => b",\"stream\":true,\"status\":",
            false => b",\"stream\":false,\"status\":",
        });
        number(out, u64::from(self.status));
        member(out, b",\"outcome\":", self.outcome.as_str());
        if !self.limits.is_empty() {
            out.extend_from_slice(b",\"limits\":[");
            for (i, limit) in self.limits.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                string(out, limit);
            }
            out.push(b']');
        }
        if let Some(deployment) = &self.deployment {
            member(out, b",\"deployment\":", deployment);
        }
        if self.failed_attempts != 0 {
            out.extend_from_slice(b",\"failed_attempts\":");
            number(out, u64::from(self.failed_attempts));
        }
        if let Some(n) = self.queued_ms {
            out.extend_from_slice(b",\"queued_ms\":");
            number(out, n);
        }
        out.extend_from_slice(b",\"tokens\":");
        number(out, self.tokens);
        out.extend_from_slice(match self.reported {
            true => b",\"reported\":true",
            false => b",\"reported\":false",
        });
        if let Some(n) = self.output_tokens {
            out.extend_from_slice(b",\"output_tokens\":");
            number(out, n);
        }
        out.extend_from_slice(b",\"head_ms\":");
        number(out, self.head_ms);
        out.extend_from_slice(b",\"latency_ms\":");
        number(out, self.latency_ms);
        out.push(b'}');
    }
}

/// `name` (`,"name":`, ours: nothing in it to escape) and `value` as a JSON string.
fn member(out: &mut Vec<u8>, name: &[u8], value: &str) {
    out.extend_from_slice(name);
    string(out, value);
}

/// `value` in decimal.
fn number(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// `s` as a JSON string, escaped as serde_json escapes it: `"` and `\`, the control characters
/// (`\b \f \n \r \t` by name, the others as `\u00XX`); everything else as it is.
fn string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    // Nearly every string has nothing to escape: one pass without branches finds out.
    let plain = !bytes.iter().fold(false, |any, &b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if plain {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let named: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if named.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(named);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::record::Outcome;

    fn text() -> impl Strategy<Value = String> {
        // Plain words, and every kind of character that JSON escapes or passes through.
        prop_oneof![
            "[a-z0-9/_.-]{0,24}",
            proptest::collection::vec(any::<char>(), 0..16).prop_map(String::from_iter),
            proptest::collection::vec(0u8..0x80, 0..16)
                .prop_map(|b| b.into_iter().map(char::from).collect()),
        ]
    }

    fn outcome() -> impl Strategy<Value = Outcome> {
        prop_oneof![
            Just(Outcome::Served),
            Just(Outcome::ShadowRefused),
            Just(Outcome::Refused),
            Just(Outcome::Unavailable),
            Just(Outcome::Failed),
        ]
    }

    prop_compose! {
        fn line()(
            numbers in proptest::array::uniform8(any::<u64>()),
            maybe in proptest::array::uniform4(proptest::option::of(any::<u64>())),
            texts in proptest::array::uniform5(text()),
            optional in proptest::array::uniform5(proptest::option::of(text())),
            limits in proptest::collection::vec(text(), 0..3),
            flags in proptest::array::uniform2(any::<bool>()),
            status in any::<u16>(),
            failed_attempts in prop_oneof![Just(0u32), any::<u32>()],
            outcome in outcome(),
        ) -> RecordLine {
            let [gateway, name, team, priority, deployment] = optional;
            let [model, endpoint, key, _, _] = texts;
            let (gateway, endpoint, key) = (gateway.map(Into::into), endpoint.into(), key.into());
            RecordLine {
                time_ms: numbers[0],
                gateway,
                model,
                name,
                endpoint,
                key,
                team,
                priority,
                flow: numbers[1],
                prompt_tokens: numbers[2],
                max_tokens: maybe[0],
                max_wait_ms: maybe[1],
                stream: flags[0],
                status,
                outcome,
                limits,
                deployment,
                failed_attempts,
                queued_ms: maybe[2],
                tokens: numbers[3],
                reported: flags[1],
                output_tokens: maybe[3],
                head_ms: numbers[4],
                latency_ms: numbers[5],
            }
        }
    }

    proptest! {
        /// The same bytes as serde_json's, and they read back as the line.
        #[test]
        fn writes_what_serde_json_writes(line in line()) {
            let mut ours = Vec::new();
            line.write_json(&mut ours);
            let theirs = serde_json::to_vec(&line).unwrap();
            prop_assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs)
            );
            let back: RecordLine = serde_json::from_slice(&ours).unwrap();
            prop_assert_eq!(back, line);
        }
    }

    #[test]
    fn numbers_at_their_edges() {
        for n in [0, 9, 10, 99, 100, u64::MAX] {
            let mut out = Vec::new();
            number(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }
}
