//! The response body, decoded from the read buffer: by its length, chunked, or to the close.

use bytes::{Buf, Bytes, BytesMut};

use super::ProtocolError;

/// The longest chunk-size line (the size and any extensions).
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// The most bytes of chunk extensions read (and dropped) over a whole body, so that framing
/// cannot outweigh data without bound.
const MAX_EXTENSIONS: usize = 16 * 1024;
/// The most bytes of trailers read (and dropped) after the last chunk.
const MAX_TRAILERS: usize = 16 * 1024;

/// Decodes a response body, from bytes as they are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decoder {
    /// `Content-Length`: this many bytes still to come.
    Length(u64),
    /// `Transfer-Encoding: chunked`, at this point of the chunk framing.
    Chunked(Chunked),
    /// No length: the body runs until the upstream closes the connection.
    Close,
    /// The body has ended.
    Done,
}

/// Where a chunked body's decoding is, and the extension bytes read so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunked {
    at: Chunk,
    extensions: usize,
}

/// A point of the chunk framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk's data: this many bytes still to come.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last (empty) chunk: trailer lines up to an empty one, this many bytes so far.
    Trailers(usize),
}

impl Decoder {
    /// A chunked body's decoder, at its start.
    pub(crate) fn chunked() -> Self {
        Decoder::Chunked(Chunked {
            at: Chunk::Size,
            extensions: 0,
        })
    }

    /// Whether the body has ended.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self, Decoder::Done | Decoder::Length(0))
    }

    /// Data bytes still to come, when the framing says.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }

    /// Decodes as much of `buf` as it can, taking the body's data out of it into `out` (the
    /// framing bytes are dropped); what belongs to no complete piece stays in `buf` for the next
    /// call. True when the body has ended (what is left in `buf` then is not the body's).
    pub(crate) fn decode(
        &mut self,
        buf: &mut BytesMut,
        out: &mut DecodedBytes,
    ) -> Result<bool, ProtocolError> {
        loop {
            match self {
                Decoder::Done => return Ok(true),
                Decoder::Length(0) => {
                    *self = Decoder::Done;
                    return Ok(true);
                }
                Decoder::Length(n) => {
                    let take = (*n).min(buf.len() as u64) as usize;
                    if take == 0 {
                        return Ok(false);
                    }
                    out.take_from(buf, take);
                    *n -= take as u64;
                }
                Decoder::Close => {
                    out.take_from(buf, buf.len());
                    return Ok(false);
                }
                Decoder::Chunked(chunk) => match decode_chunked(chunk, buf, out)? {
                    true => *self = Decoder::Done,
                    false => return Ok(false),
                },
            }
        }
    }

    /// The connection ended: fine for a body that runs to the close (now done), an error for
    /// any other that has not ended.
    pub(crate) fn end_of_input(&mut self) -> Result<(), ProtocolError> {
        match self {
            Decoder::Close => {
                *self = Decoder::Done;
                Ok(())
            }
            d if d.is_done() => Ok(()),
            _ => Err(ProtocolError::Incomplete),
        }
    }
}

/// [`Decoder::decode`] for a chunked body; true at its end.
fn decode_chunked(
    state: &mut Chunked,
    buf: &mut BytesMut,
    out: &mut DecodedBytes,
) -> Result<bool, ProtocolError> {
    let chunk = &mut state.at;
    loop {
        match chunk {
            Chunk::Size => {
                let Some(end) = memchr::memchr(b'\n', buf) else {
                    return if buf.len() > MAX_CHUNK_LINE {
                        Err(ProtocolError::BadChunkSize)
                    } else {
                        Ok(false)
                    };
                };
                if end > MAX_CHUNK_LINE {
                    return Err(ProtocolError::BadChunkSize);
                }
                let (size, extensions) = chunk_size(&buf[..end])?;
                state.extensions += extensions;
                if state.extensions > MAX_EXTENSIONS {
                    return Err(ProtocolError::BadChunkSize);
                }
                buf.advance(end + 1);
                *chunk = if size == 0 {
                    Chunk::Trailers(0)
                } else {
                    Chunk::Data(size)
                };
            }
            Chunk::Data(n) => {
                let take = (*n).min(buf.len() as u64) as usize;
                if take == 0 {
                    return Ok(false);
                }
                out.take_from(buf, take);
                *n -= take as u64;
                if *n == 0 {
                    *chunk = Chunk::DataEnd;
                }
            }
            Chunk::DataEnd => match &buf[..buf.len().min(2)] {
                b"\r\n" => {
                    buf.advance(2);
                    *chunk = Chunk::Size;
                }
                b"" | b"\r" => return Ok(false),
                _ => return Err(ProtocolError::BadChunkEnd),
            },
            Chunk::Trailers(read) => {
                let Some(end) = memchr::memchr(b'\n', buf) else {
                    return if *read + buf.len() > MAX_TRAILERS {
                        Err(ProtocolError::TrailersTooLarge)
                    } else {
                        Ok(false)
                    };
                };
                let blank = matches!(&buf[..=end], b"\r\n" | b"\n");
                buf.advance(end + 1);
                if blank {
                    return Ok(true);
                }
                *read += end + 1;
                if *read > MAX_TRAILERS {
                    return Err(ProtocolError::TrailersTooLarge);
                }
            }
        }
    }
}

/// The size of a chunk-size line (without its `\n`), and the length of its extensions:
/// hexadecimal digits, then optionally whitespace and `;` extensions (no control bytes but tabs),
/// and a `\r`.
fn chunk_size(line: &[u8]) -> Result<(u64, usize), ProtocolError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // The digits read as they are counted (at most 16, so no overflow).
    let mut size = 0u64;
    let mut digits = 0;
    for &b in line {
        let value = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => break,
        };
        digits += 1;
        if digits > 16 {
            return Err(ProtocolError::BadChunkSize);
        }
        size = size << 4 | u64::from(value);
    }
    if digits == 0 {
        return Err(ProtocolError::BadChunkSize);
    }
    let rest = line[digits..].trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(ProtocolError::BadChunkSize);
    }
    if rest.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(ProtocolError::BadChunkSize);
    }
    Ok((size, rest.len()))
}

/// Data decoded in one go, as one piece: the first slice kept as it is (no copy when it is the
/// only one), later ones joined to it.
#[derive(Debug, Default)]
pub(crate) struct DecodedBytes {
    first: Option<Bytes>,
    joined: Option<BytesMut>,
}

impl DecodedBytes {
    /// Takes the first `n` bytes of `buf`: sliced out when they are the first piece (no copy),
    /// else copied onto what is gathered.
    fn take_from(&mut self, buf: &mut BytesMut, n: usize) {
        if n == 0 {
            return;
        }
        match (&self.first, &mut self.joined) {
            (None, _) => self.first = Some(buf.split_to(n).freeze()),
            (Some(_), Some(joined)) => joined.extend_from_slice(&buf[..n]),
            (Some(held), None) => {
                let mut joined = BytesMut::with_capacity((held.len() + n) * 4);
                joined.extend_from_slice(held);
                joined.extend_from_slice(&buf[..n]);
                self.joined = Some(joined);
            }
        }
        if self.joined.is_some() {
            buf.advance(n);
        }
    }

    pub(crate) fn len(&self) -> usize {
        match (&self.first, &self.joined) {
            (_, Some(joined)) => joined.len(),
            (Some(first), None) => first.len(),
            (None, None) => 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// The data gathered, leaving this empty.
    pub(crate) fn take(&mut self) -> Option<Bytes> {
        match (self.first.take(), self.joined.take()) {
            (_, Some(joined)) => Some(joined.freeze()),
            (first, None) => first,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse_head, EVERY_HEADER};
    use super::*;
    use http::Method;
    use proptest::prelude::*;

    fn decode_all(
        decoder: &mut Decoder,
        pieces: &[&[u8]],
    ) -> Result<(Vec<u8>, bool), ProtocolError> {
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut done = false;
        for piece in pieces {
            buf.extend_from_slice(piece);
            let mut out = DecodedBytes::default();
            done = decoder.decode(&mut buf, &mut out)?;
            data.extend_from_slice(&out.take().unwrap_or_default());
            if done {
                break;
            }
        }
        Ok((data, done))
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let mut d = Decoder::chunked();
        let (data, done) = decode_all(
            &mut d,
            &[b"3;name=v\r\none\r\nA \r\n0123456789\r\n0\r\nx-trailer: t\r\n\r\nnext"],
        )
        .unwrap();
        assert_eq!(data, b"one0123456789");
        assert!(done && d.is_done());
    }

    #[test]
    fn chunk_size_lines_read_every_hex_digit_up_to_sixteen() {
        assert_eq!(chunk_size(b"0"), Ok((0, 0)));
        assert_eq!(chunk_size(b"1f\r"), Ok((31, 0)));
        assert_eq!(chunk_size(b"Ab09;x=y"), Ok((0xab09, 4)));
        assert_eq!(chunk_size(b"ffffffffffffffff"), Ok((u64::MAX, 0)));
        assert_eq!(chunk_size(b"0000000000000010 \r"), Ok((16, 0)));
        for bad in [
            &b""[..],
            b";x",
            b"00000000000000001",
            b"1g",
            b"-1",
            b"+1",
            b"0x10",
        ] {
            assert_eq!(
                chunk_size(bad),
                Err(ProtocolError::BadChunkSize),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn bad_chunked_bodies_are_errors() {
        for bad in [
            &b"g\r\n"[..],
            b"\r\n",
            b"3 x\r\n",
            b"11111111111111111\r\n",
            b"3\r\nabcX\r\n",
        ] {
            let mut d = Decoder::chunked();
            assert!(
                decode_all(&mut d, &[bad]).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut d = Decoder::chunked();
        let long = vec![b'1'; MAX_CHUNK_LINE + 1];
        assert_eq!(
            decode_all(&mut d, &[&long]).unwrap_err(),
            ProtocolError::BadChunkSize
        );
        let mut d = Decoder::chunked();
        let trailers = format!("0\r\n{}", "x: y\r\n".repeat(MAX_TRAILERS / 6 + 1));
        assert_eq!(
            decode_all(&mut d, &[trailers.as_bytes()]).unwrap_err(),
            ProtocolError::TrailersTooLarge
        );
        let mut d = Decoder::chunked();
        decode_all(&mut d, &[b"5\r\nab"]).unwrap();
        assert_eq!(d.end_of_input().unwrap_err(), ProtocolError::Incomplete);
    }

    #[test]
    fn chunk_extensions_are_bounded_and_hold_no_control_bytes() {
        let mut d = Decoder::chunked();
        assert_eq!(
            decode_all(&mut d, &[b"5;\rX\r\nhello\r\n"]).unwrap_err(),
            ProtocolError::BadChunkSize
        );
        let mut d = Decoder::chunked();
        let (data, _) = decode_all(&mut d, &[b"5;a=\"b\tc\"\r\nhello\r\n"]).unwrap();
        assert_eq!(data, b"hello");
        // 1 data byte per ~1 KiB of extensions: refused once the body's extensions pass 16 KiB.
        let ext = "e".repeat(1000);
        let body: String = (0..20).map(|_| format!("1;{ext}\r\nx\r\n")).collect();
        let mut d = Decoder::chunked();
        assert_eq!(
            decode_all(&mut d, &[body.as_bytes()]).unwrap_err(),
            ProtocolError::BadChunkSize
        );
    }

    #[test]
    fn lengths_and_close_delimited_bodies() {
        let mut d = Decoder::Length(5);
        let (data, done) = decode_all(&mut d, &[b"ab", b"cdeEXTRA"]).unwrap();
        assert_eq!(data, b"abcde");
        assert!(done);
        let mut d = Decoder::Length(5);
        decode_all(&mut d, &[b"ab"]).unwrap();
        assert_eq!(d.end_of_input().unwrap_err(), ProtocolError::Incomplete);
        let mut d = Decoder::Close;
        let (data, done) = decode_all(&mut d, &[b"ab", b"cd"]).unwrap();
        assert_eq!((data.as_slice(), done), (&b"abcd"[..], false));
        d.end_of_input().unwrap();
        assert!(d.is_done());
    }

    /// Chunked encoding of `chunks`, with an extension on every other size line.
    fn encode(chunks: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, c) in chunks.iter().filter(|c| !c.is_empty()).enumerate() {
            let ext = if i % 2 == 0 { "" } else { ";a=b" };
            out.extend_from_slice(format!("{:x}{ext}\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    proptest! {
        /// However the bytes are split into reads, the data comes out whole and in order, and the
        /// body ends exactly at its last CRLF.
        #[test]
        fn chunked_decoding_does_not_depend_on_read_boundaries(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let mut wire = encode(&chunks);
            wire.extend_from_slice(b"HTTP/1.1");
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
            at.sort_unstable();
            let mut pieces = Vec::new();
            let mut last = 0;
            for a in at.into_iter().chain([wire.len()]) {
                pieces.push(&wire[last..a]);
                last = a;
            }
            let (data, done) = decode_all(&mut Decoder::chunked(), &pieces).unwrap();
            prop_assert!(done);
            prop_assert_eq!(data, chunks.concat());
        }

        /// Any bytes at all: an answer or an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut d = Decoder::chunked();
            let _ = decode_all(&mut d, &[&bytes]);
            let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\n"[..]);
            buf.extend_from_slice(&bytes);
            let _ = parse_head(&mut buf, &Method::POST, EVERY_HEADER);
        }
    }
}
