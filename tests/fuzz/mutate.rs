//! Mutations of real inputs (byte flips, truncations, deletions, duplications, insertions of
//! tokens that matter to the parsers, splices, rarely a very long run) and random splits.

use proptest::prelude::*;

/// One edit. Positions are taken modulo the input's length (+1), so any value applies anywhere.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// XOR one byte.
    Flip { at: usize, mask: u8 },
    /// Cut everything from `at` on.
    Truncate { at: usize },
    /// Remove `len` bytes.
    Delete { at: usize, len: u16 },
    /// Repeat `len` bytes right after themselves.
    Duplicate { at: usize, len: u16 },
    /// Insert a token from the dictionary.
    Insert { at: usize, token: usize },
    /// Insert `len` bytes from the other input `other` (another corpus entry), starting at `from`.
    Splice {
        at: usize,
        other: usize,
        from: usize,
        len: u16,
    },
}

/// A run of `len` repetitions of a pattern, inserted at `at`: the lines, events and bodies past
/// the parsers' bounds (1 MiB lines, 4 MiB JSON bodies). Rare, as each costs milliseconds.
#[derive(Debug, Clone)]
pub struct LongRun {
    at: usize,
    pattern: usize,
    len: usize,
}

const LONG_PATTERNS: &[&[u8]] = &[
    b"a",
    b" ",
    b"\\n",
    b"data: x\n",
    b"0",
    b"\xc3\xa9",
    b"{\"a\":",
];

/// `mutations` applied in order to corpus entry `base` (modulo the corpus size), then `long`.
#[derive(Debug, Clone)]
pub struct Mutated {
    pub base: usize,
    pub mutations: Vec<Mutation>,
    pub long: Option<LongRun>,
}

impl Mutated {
    /// The mutated bytes.
    pub fn apply(&self, corpus: &[Vec<u8>], dictionary: &[&[u8]]) -> Vec<u8> {
        let mut v = corpus[self.base % corpus.len()].clone();
        for m in &self.mutations {
            let at = |at: usize, v: &Vec<u8>| at % (v.len() + 1);
            match *m {
                Mutation::Flip { at: i, mask } => {
                    if !v.is_empty() {
                        let i = i % v.len();
                        v[i] ^= mask;
                    }
                }
                Mutation::Truncate { at: i } => v.truncate(at(i, &v)),
                Mutation::Delete { at: i, len } => {
                    let i = at(i, &v);
                    let end = (i + usize::from(len)).min(v.len());
                    v.drain(i..end);
                }
                Mutation::Duplicate { at: i, len } => {
                    let i = at(i, &v);
                    let end = (i + usize::from(len)).min(v.len());
                    let copy = v[i..end].to_vec();
                    v.splice(end..end, copy);
                }
                Mutation::Insert { at: i, token } => {
                    let i = at(i, &v);
                    let token = dictionary[token % dictionary.len()];
                    v.splice(i..i, token.iter().copied());
                }
                Mutation::Splice {
                    at: i,
                    other,
                    from,
                    len,
                } => {
                    let i = at(i, &v);
                    let other = &corpus[other % corpus.len()];
                    let from = from % (other.len() + 1);
                    let end = (from + usize::from(len)).min(other.len());
                    v.splice(i..i, other[from..end].iter().copied());
                }
            }
        }
        if let Some(LongRun { at, pattern, len }) = self.long {
            let at = at % (v.len() + 1);
            let pattern = LONG_PATTERNS[pattern % LONG_PATTERNS.len()];
            let run: Vec<u8> = pattern.iter().copied().cycle().take(len).collect();
            v.splice(at..at, run);
        }
        v
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        1 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        2 => (any::<usize>(), 0u16..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        2 => (any::<usize>(), 0u16..512).prop_map(|(at, len)| Mutation::Duplicate { at, len }),
        6 => (any::<usize>(), any::<usize>()).prop_map(|(at, token)| Mutation::Insert { at, token }),
        2 => (any::<usize>(), any::<usize>(), any::<usize>(), 0u16..256)
            .prop_map(|(at, other, from, len)| Mutation::Splice { at, other, from, len }),
    ]
}

/// Mutated corpus entries: 0 to 6 edits; one case in ~2,000 also gets a run of up to
/// `max_long` bytes.
pub fn mutated(max_long: usize) -> impl Strategy<Value = Mutated> {
    let long = prop_oneof![
        2000 => Just(None),
        1 => (any::<usize>(), any::<usize>(), 0..=max_long)
            .prop_map(|(at, pattern, len)| Some(LongRun { at, pattern, len })),
    ];
    (
        any::<usize>(),
        proptest::collection::vec(mutation(), 0..6),
        long,
    )
        .prop_map(|(base, mutations, long)| Mutated {
            base,
            mutations,
            long,
        })
}

/// Where to cut an input of `len` bytes: `cuts` (any values, taken modulo `len + 1`), sorted; or
/// every byte when `bytewise` (only for inputs up to 4 KiB, to keep cases cheap).
#[derive(Debug, Clone)]
pub struct Splits {
    pub cuts: Vec<usize>,
    pub bytewise: bool,
}

impl Splits {
    /// The pieces of `data`.
    pub fn pieces<'a>(&self, data: &'a [u8]) -> Vec<&'a [u8]> {
        if self.bytewise && data.len() <= 4096 {
            return data.chunks(1).collect();
        }
        let mut cuts: Vec<usize> = self.cuts.iter().map(|c| c % (data.len() + 1)).collect();
        cuts.sort_unstable();
        let mut out = Vec::with_capacity(cuts.len() + 1);
        let mut start = 0;
        for c in cuts {
            out.push(&data[start..c]);
            start = c;
        }
        out.push(&data[start..]);
        out
    }
}

pub fn splits() -> impl Strategy<Value = Splits> {
    (
        proptest::collection::vec(any::<usize>(), 0..24),
        prop::bool::weighted(0.05),
    )
        .prop_map(|(cuts, bytewise)| Splits { cuts, bytewise })
}
