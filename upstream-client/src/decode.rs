//! Response bodies in a `Content-Encoding`: [`ContentCoding`] read from the head, and
//! [`DecodedBody`], which passes an identity body through and decodes gzip, deflate (zlib or raw)
//! and brotli as it is read.
//!
//! Why decode rather than forward the encoded bytes: a caller that meters a body (tokens in an
//! LLM answer) needs its text, and one that asked for `identity` and got an encoding anyway must
//! not pass the bytes on without the header that says how to read them. Each frame holds at most
//! about [`MAX_DECODED_FRAME`] bytes of decoded data: a small encoded body that expands a
//! thousandfold comes out a piece at a time, never as one allocation.

use std::io::{self, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use brotli_decompressor::{BrotliDecompressStream, BrotliResult, BrotliState, StandardAlloc};
use bytes::{Buf, Bytes};
use flate2::{Decompress, FlushDecompress, Status};
use http::header::CONTENT_ENCODING;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::body::UpstreamBody;
use crate::error::BodyError;

/// Decoded data gathered into one frame before it is handed on (the decoders stop at it and go
/// on at the next poll).
pub const MAX_DECODED_FRAME: usize = 64 * 1024;
/// Encoded bytes fed to the gzip decoder at a time: deflate expands at most about 1,032 to 1, so
/// one step adds at most about 1 MiB past [`MAX_DECODED_FRAME`].
const GZIP_STEP: usize = 1024;
/// Room made for output before each step of the deflate and brotli decoders.
const OUTPUT_STEP: usize = 16 * 1024;

/// A response's `Content-Encoding`, as this client decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentCoding {
    /// None, or `identity`: the body is passed through.
    Identity,
    /// `gzip` (or `x-gzip`).
    Gzip,
    /// `deflate`: the zlib format, or (as some servers send it) raw deflate.
    Deflate,
    /// `br`.
    Brotli,
}

/// A `Content-Encoding` this client does not decode (`zstd`, `compress`, several codings), as
/// the upstream wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedCoding(pub String);

impl std::fmt::Display for UnsupportedCoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the response's Content-Encoding `{}` is not one this client decodes (gzip, deflate, br)", self.0)
    }
}

impl std::error::Error for UnsupportedCoding {}

impl ContentCoding {
    /// The coding of a response with `headers`: every `Content-Encoding` line, each a list,
    /// `identity` entries left out; more than one coding, or one not named here, is
    /// [`UnsupportedCoding`].
    pub fn of(headers: &HeaderMap) -> Result<Self, UnsupportedCoding> {
        let mut found = ContentCoding::Identity;
        for value in headers.get_all(CONTENT_ENCODING) {
            let unsupported =
                || UnsupportedCoding(String::from_utf8_lossy(value.as_bytes()).into());
            for token in value.as_bytes().split(|&b| b == b',') {
                let token = token.trim_ascii();
                let coding = if token.is_empty() || token.eq_ignore_ascii_case(b"identity") {
                    continue;
                } else if token.eq_ignore_ascii_case(b"gzip")
                    || token.eq_ignore_ascii_case(b"x-gzip")
                {
                    ContentCoding::Gzip
                } else if token.eq_ignore_ascii_case(b"deflate") {
                    ContentCoding::Deflate
                } else if token.eq_ignore_ascii_case(b"br") {
                    ContentCoding::Brotli
                } else {
                    return Err(unsupported());
                };
                if found != ContentCoding::Identity {
                    return Err(unsupported());
                }
                found = coding;
            }
        }
        Ok(found)
    }
}

/// A body (an [`UpstreamBody`], or any body of `Bytes` failing with [`BodyError`]) decoded from
/// its [`ContentCoding`]: passed through as it is for `Identity` (one branch a frame), else
/// decoded as its frames come. A body that does not decode,
/// ends before its encoding does, or has bytes after it, ends in [`BodyError::Decode`].
#[derive(Debug)]
pub struct DecodedBody<B = UpstreamBody> {
    inner: B,
    /// `None` for an identity body. Boxed: the decoders' state is large and rarely there.
    decoding: Option<Box<Decoding>>,
}

impl<B> DecodedBody<B> {
    /// `inner`, decoded from `coding`.
    pub fn new(inner: B, coding: ContentCoding) -> Self {
        let decoder = match coding {
            ContentCoding::Identity => {
                return Self {
                    inner,
                    decoding: None,
                }
            }
            ContentCoding::Gzip => Decoder::Gzip(flate2::write::GzDecoder::new(Vec::new())),
            ContentCoding::Deflate => Decoder::Deflate(None),
            ContentCoding::Brotli => Decoder::Brotli(Box::new(BrotliState::new(
                StandardAlloc::default(),
                StandardAlloc::default(),
                StandardAlloc::default(),
            ))),
        };
        Self {
            inner,
            decoding: Some(Box::new(Decoding {
                decoder,
                pending: Bytes::new(),
                input_ended: false,
                any_input: false,
                finished: false,
            })),
        }
    }
}

/// A body's decoding: its decoder, the encoded bytes read but not yet decoded, and how far it is.
struct Decoding {
    decoder: Decoder,
    pending: Bytes,
    /// The encoded body has ended.
    input_ended: bool,
    /// A byte of it came: an encoded body of none is an empty body, not a broken encoding.
    any_input: bool,
    /// The encoding has ended (and with it the decoded body).
    finished: bool,
}

impl std::fmt::Debug for Decoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoding")
            .field("pending", &self.pending.len())
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

// Held in a boxed `Decoding`: the variants' sizes do not matter to the body.
#[allow(clippy::large_enum_variant)]
enum Decoder {
    /// Its output gathers in its `Vec`.
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    /// Made from the first two bytes (zlib's header, or raw deflate without one).
    Deflate(Option<Decompress>),
    Brotli(Box<BrotliState<StandardAlloc, StandardAlloc, StandardAlloc>>),
}

fn corrupt(what: &str) -> BodyError {
    BodyError::Decode(io::Error::new(io::ErrorKind::InvalidData, what.to_owned()))
}

/// Whether `b0 b1` is a zlib header (RFC 1950: deflate, a check that divides by 31).
fn is_zlib_header(b0: u8, b1: u8) -> bool {
    b0 & 0x0f == 8 && (u16::from(b0) << 8 | u16::from(b1)) % 31 == 0
}

impl Decoding {
    /// Decodes what is pending, up to about [`MAX_DECODED_FRAME`] bytes of output.
    fn step(&mut self) -> Result<Vec<u8>, BodyError> {
        let mut out = Vec::new();
        while out.len() < MAX_DECODED_FRAME && !self.finished {
            let before = (self.pending.len(), out.len());
            match &mut self.decoder {
                Decoder::Gzip(gzip) => {
                    if self.pending.is_empty() {
                        break;
                    }
                    let take = self.pending.len().min(GZIP_STEP);
                    let n = gzip
                        .write(&self.pending[..take])
                        .map_err(BodyError::Decode)?;
                    if n == 0 {
                        return Err(corrupt("bytes after the end of the gzip body"));
                    }
                    self.pending.advance(n);
                    out.append(gzip.get_mut());
                }
                Decoder::Deflate(inflate) => {
                    if self.pending.is_empty() {
                        break;
                    }
                    let inflate = match inflate {
                        Some(inflate) => inflate,
                        None if self.pending.len() < 2 && !self.input_ended => break,
                        None => {
                            let zlib = self.pending.len() >= 2
                                && is_zlib_header(self.pending[0], self.pending[1]);
                            inflate.insert(Decompress::new(zlib))
                        }
                    };
                    out.reserve(OUTPUT_STEP);
                    let in_before = inflate.total_in();
                    let status = inflate
                        .decompress_vec(&self.pending, &mut out, FlushDecompress::None)
                        .map_err(|e| {
                            BodyError::Decode(io::Error::new(io::ErrorKind::InvalidData, e))
                        })?;
                    let consumed = (inflate.total_in() - in_before) as usize;
                    self.pending.advance(consumed);
                    if status == Status::StreamEnd {
                        self.finished = true;
                    }
                }
                Decoder::Brotli(state) => {
                    let start = out.len();
                    out.resize(start + OUTPUT_STEP, 0);
                    let (mut available_in, mut input_offset) = (self.pending.len(), 0);
                    let (mut available_out, mut output_offset, mut total) = (OUTPUT_STEP, 0, 0);
                    let result = BrotliDecompressStream(
                        &mut available_in,
                        &mut input_offset,
                        &self.pending,
                        &mut available_out,
                        &mut output_offset,
                        &mut out[start..],
                        &mut total,
                        state,
                    );
                    out.truncate(start + output_offset);
                    self.pending.advance(input_offset);
                    match result {
                        BrotliResult::ResultSuccess => self.finished = true,
                        BrotliResult::ResultFailure => {
                            return Err(corrupt("the brotli body does not decode"))
                        }
                        BrotliResult::NeedsMoreInput => break,
                        BrotliResult::NeedsMoreOutput => {}
                    }
                }
            }
            if (self.pending.len(), out.len()) == before && !self.finished {
                // No progress: it needs more input than there is.
                break;
            }
        }
        if self.finished && !self.pending.is_empty() {
            return Err(corrupt("bytes after the end of the encoded body"));
        }
        Ok(out)
    }

    /// The encoded body ended: the rest of the output, or an error if its encoding did not end.
    fn finish(&mut self) -> Result<Vec<u8>, BodyError> {
        if !self.any_input {
            self.finished = true;
            return Ok(Vec::new());
        }
        match &mut self.decoder {
            Decoder::Gzip(gzip) => {
                gzip.try_finish()
                    .map_err(|_| corrupt("the gzip body ended before its end"))?;
                self.finished = true;
                Ok(std::mem::take(gzip.get_mut()))
            }
            _ if self.finished => Ok(Vec::new()),
            Decoder::Deflate(_) => Err(corrupt("the deflate body ended before its end")),
            Decoder::Brotli(_) => Err(corrupt("the brotli body ended before its end")),
        }
    }
}

impl<B> Body for DecodedBody<B>
where
    B: Body<Data = Bytes, Error = BodyError> + Unpin,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let Some(decoding) = this.decoding.as_mut() else {
            return Pin::new(&mut this.inner).poll_frame(cx);
        };
        loop {
            if decoding.finished && decoding.input_ended {
                return Poll::Ready(None);
            }
            let out = match decoding.step() {
                Ok(out) if !out.is_empty() => out,
                Ok(_) if decoding.input_ended => match decoding.finish() {
                    Ok(out) if !out.is_empty() => out,
                    Ok(_) => return Poll::Ready(None),
                    Err(e) => {
                        decoding.finished = true;
                        return Poll::Ready(Some(Err(e)));
                    }
                },
                Ok(_) => match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            decoding.any_input |= !data.is_empty();
                            decoding.pending = if decoding.pending.is_empty() {
                                data
                            } else {
                                [&decoding.pending[..], &data[..]].concat().into()
                            };
                        }
                        continue;
                    }
                    Some(Err(e)) => {
                        (decoding.finished, decoding.input_ended) = (true, true);
                        return Poll::Ready(Some(Err(e)));
                    }
                    None => {
                        decoding.input_ended = true;
                        continue;
                    }
                },
                Err(e) => {
                    (decoding.finished, decoding.input_ended) = (true, true);
                    return Poll::Ready(Some(Err(e)));
                }
            };
            return Poll::Ready(Some(Ok(Frame::data(out.into()))));
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.decoding {
            None => self.inner.is_end_stream(),
            Some(decoding) => decoding.finished && decoding.input_ended,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.decoding {
            None => self.inner.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use http_body_util::BodyExt;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    /// A body of the given pieces, then perhaps an error.
    struct Pieces(VecDeque<Result<Bytes, BodyError>>);

    impl Body for Pieces {
        type Data = Bytes;
        type Error = BodyError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
            Poll::Ready(self.0.pop_front().map(|piece| piece.map(Frame::data)))
        }
        fn is_end_stream(&self) -> bool {
            self.0.is_empty()
        }
    }

    fn encode(coding: ContentCoding, data: &[u8]) -> Vec<u8> {
        use flate2::write::{GzEncoder, ZlibEncoder};
        use flate2::Compression;
        match coding {
            ContentCoding::Identity => data.to_vec(),
            ContentCoding::Gzip => {
                let mut e = GzEncoder::new(Vec::new(), Compression::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            ContentCoding::Deflate => {
                let mut e = ZlibEncoder::new(Vec::new(), Compression::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            ContentCoding::Brotli => {
                let mut out = Vec::new();
                let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                e.write_all(data).unwrap();
                drop(e);
                out
            }
        }
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// The decoded body of `wire` cut at `cuts`, and its largest frame.
    async fn decode(
        coding: ContentCoding,
        wire: &[u8],
        cuts: &[usize],
    ) -> Result<(Vec<u8>, usize), String> {
        let mut pieces = VecDeque::new();
        let mut last = 0;
        for &at in cuts.iter().chain([&wire.len()]) {
            pieces.push_back(Ok(Bytes::copy_from_slice(&wire[last..at])));
            last = at;
        }
        let mut body = DecodedBody::new(Pieces(pieces), coding);
        let (mut data, mut largest) = (Vec::new(), 0);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| e.to_string())?.into_data().unwrap();
            largest = largest.max(frame.len());
            data.extend_from_slice(&frame);
        }
        assert!(body.is_end_stream());
        Ok((data, largest))
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    const CODINGS: [ContentCoding; 4] = [
        ContentCoding::Identity,
        ContentCoding::Gzip,
        ContentCoding::Deflate,
        ContentCoding::Brotli,
    ];

    proptest! {
        /// Every coding, however its bytes are split into frames: the data comes out whole.
        #[test]
        fn every_coding_decodes_whatever_the_frame_boundaries(
            data in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'{'), any::<u8>()], 0..3000),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            for coding in CODINGS {
                let wire = encode(coding, &data);
                let mut at: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
                at.sort_unstable();
                let (got, _) = block_on(decode(coding, &wire, &at)).unwrap();
                prop_assert_eq!(&got, &data, "{:?}", coding);
            }
        }
    }

    #[test]
    fn raw_deflate_without_a_zlib_header_decodes_too() {
        let data = b"{\"usage\":{\"total_tokens\":30}}".repeat(20);
        let wire = raw_deflate(&data);
        for cut in 0..wire.len() {
            let (got, _) = block_on(decode(ContentCoding::Deflate, &wire, &[cut])).unwrap();
            assert_eq!(got, data, "cut at {cut}");
        }
    }

    /// A body cut short, garbage, or bytes after the encoded body: an error, for every coding.
    #[test]
    fn broken_encodings_are_errors() {
        let data = b"data: {\"choices\":[]}\n\n".repeat(50);
        for coding in &CODINGS[1..] {
            let wire = encode(*coding, &data);
            let cut = block_on(decode(*coding, &wire[..wire.len() - 3], &[])).unwrap_err();
            assert!(
                cut.contains("decoding the response body"),
                "{coding:?}: {cut}"
            );
            let mut more = wire.clone();
            more.extend_from_slice(b"trailing");
            let after = block_on(decode(*coding, &more, &[])).unwrap_err();
            assert!(after.contains("decoding"), "{coding:?}: {after}");
            let garbage =
                block_on(decode(*coding, b"\xff\xfe not encoded at all", &[])).unwrap_err();
            assert!(garbage.contains("decoding"), "{coding:?}: {garbage}");
            // No byte at all: an empty body.
            assert_eq!(block_on(decode(*coding, b"", &[])).unwrap().0, b"");
        }
    }

    /// A body that expands a thousandfold comes out in frames of bounded size.
    #[test]
    fn a_highly_compressed_body_comes_out_a_frame_at_a_time() {
        let data = vec![b'a'; 8 * 1024 * 1024];
        for coding in &CODINGS[1..] {
            let wire = encode(*coding, &data);
            assert!(wire.len() < 64 * 1024, "{coding:?}: {}", wire.len());
            let (got, largest) = block_on(decode(*coding, &wire, &[])).unwrap();
            assert!(got == data, "{coding:?}");
            assert!(
                largest <= MAX_DECODED_FRAME + 1100 * GZIP_STEP,
                "{coding:?}: {largest}"
            );
        }
    }

    #[test]
    fn the_coding_is_read_from_every_header_line() {
        let of = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(CONTENT_ENCODING, HeaderValue::from_str(v).unwrap());
            }
            ContentCoding::of(&headers)
        };
        assert_eq!(of(&[]), Ok(ContentCoding::Identity));
        assert_eq!(of(&["identity"]), Ok(ContentCoding::Identity));
        assert_eq!(of(&["GZIP"]), Ok(ContentCoding::Gzip));
        assert_eq!(of(&["x-gzip"]), Ok(ContentCoding::Gzip));
        assert_eq!(of(&["identity, deflate"]), Ok(ContentCoding::Deflate));
        assert_eq!(of(&["br"]), Ok(ContentCoding::Brotli));
        assert_eq!(of(&["zstd"]), Err(UnsupportedCoding("zstd".into())));
        assert_eq!(
            of(&["gzip", "br"]),
            Err(UnsupportedCoding("br".into())),
            "two codings: not decoded"
        );
        assert!(of(&["compress"])
            .unwrap_err()
            .to_string()
            .contains("`compress`"));
    }
}
