//! Response bodies in a `Content-Encoding`: [`ContentCoding`] read from the head, and
//! [`DecodedBody`], which passes an identity body through and decodes gzip, deflate (zlib or raw)
//! and brotli as it is read.
//!
//! Why decode rather than forward the encoded bytes: a caller that meters a body (tokens in an
//! LLM answer) needs its text, and one that asked for `identity` and got an encoding anyway must
//! not pass the bytes on without the header that says how to read them. Each frame holds at most
//! about [`MAX_DECODED_FRAME`] bytes of decoded data: a small encoded body that expands a
//! thousandfold comes out a piece at a time, never as one allocation.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use brotli_decompressor::{BrotliDecompressStream, BrotliResult, BrotliState, StandardAlloc};
use bytes::{Buf, Bytes};
use flate2::{Crc, Decompress, FlushDecompress, Status};
use http::header::CONTENT_ENCODING;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::body::UpstreamBody;
use crate::error::BodyError;

/// Decoded data gathered into one frame before it is handed on (the decoders stop at it and go
/// on at the next poll).
pub const MAX_DECODED_FRAME: usize = 64 * 1024;
/// The most output of one step of a decoder (a frame gathers steps up to
/// [`MAX_DECODED_FRAME`]).
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
            ContentCoding::Gzip => Decoder::Gzip(Gzip::Header(Vec::new())),
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
                // Made once, written over by every step: only what a step produced is copied.
                buffer: vec![0; OUTPUT_STEP].into_boxed_slice(),
                input_ended: false,
                more_output: false,
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
    /// Where each step of the decoder writes.
    buffer: Box<[u8]>,
    /// The encoded body has ended.
    input_ended: bool,
    /// The last step filled `buffer`: the decoder may hold more output without more input.
    more_output: bool,
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

enum Decoder {
    /// gzip (RFC 1952): its header, the raw deflate data, its trailer.
    Gzip(Gzip),
    /// Made from the first two bytes (zlib's header, or raw deflate without one).
    Deflate(Option<Decompress>),
    Brotli(Box<BrotliState<StandardAlloc, StandardAlloc, StandardAlloc>>),
}

/// Where a gzip body's decoding is.
enum Gzip {
    /// The header's bytes so far.
    Header(Vec<u8>),
    /// The deflate data, and the CRC of what it decoded to.
    Data(Box<Decompress>, Crc),
    /// The trailer's bytes so far (CRC-32 and length, 8 bytes), and what they are checked against.
    Trailer(Vec<u8>, Crc),
}

/// The longest gzip header read (its optional name and comment are not bounded by the format).
const MAX_GZIP_HEADER: usize = 16 * 1024;

fn corrupt(what: &str) -> BodyError {
    BodyError::Decode(io::Error::new(io::ErrorKind::InvalidData, what.to_owned()))
}

/// Whether `b0 b1` is a zlib header (RFC 1950: deflate, a check that divides by 31).
fn is_zlib_header(b0: u8, b1: u8) -> bool {
    b0 & 0x0f == 8 && (u16::from(b0) << 8 | u16::from(b1)) % 31 == 0
}

/// The length of the gzip header at the start of `bytes` (RFC 1952, 2.3), `Ok(None)` when it is
/// not all there yet.
fn gzip_header(bytes: &[u8]) -> Result<Option<usize>, BodyError> {
    const FHCRC: u8 = 2;
    const FEXTRA: u8 = 4;
    const FNAME: u8 = 8;
    const FCOMMENT: u8 = 16;
    if bytes.len() < 10 {
        return Ok(None);
    }
    if bytes[..3] != [0x1f, 0x8b, 8] || bytes[3] & 0xe0 != 0 {
        return Err(corrupt("the gzip body has no gzip header"));
    }
    let flags = bytes[3];
    let mut at = 10;
    if flags & FEXTRA != 0 {
        let Some(len) = bytes.get(at..at + 2) else {
            return Ok(None);
        };
        at += 2 + usize::from(u16::from_le_bytes([len[0], len[1]]));
    }
    for flag in [FNAME, FCOMMENT] {
        if flags & flag != 0 {
            match bytes.get(at..).and_then(|rest| memchr::memchr(0, rest)) {
                Some(end) => at += end + 1,
                None => return Ok(None),
            }
        }
    }
    if flags & FHCRC != 0 {
        at += 2;
    }
    Ok((bytes.len() >= at).then_some(at))
}

/// Inflates what of `pending` it can into `buffer`, appending the output to `out`; the output
/// also goes into `crc` when given. True at the end of the deflate data.
fn inflate(
    inflate: &mut Decompress,
    pending: &mut Bytes,
    buffer: &mut [u8],
    out: &mut Vec<u8>,
    crc: Option<&mut Crc>,
) -> Result<bool, BodyError> {
    let (in_before, out_before) = (inflate.total_in(), inflate.total_out());
    let status = inflate
        .decompress(pending, buffer, FlushDecompress::None)
        .map_err(|e| BodyError::Decode(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    pending.advance((inflate.total_in() - in_before) as usize);
    let produced = &buffer[..(inflate.total_out() - out_before) as usize];
    if let Some(crc) = crc {
        crc.update(produced);
    }
    out.extend_from_slice(produced);
    Ok(status == Status::StreamEnd)
}

impl Decoding {
    /// Decodes what is pending, up to about [`MAX_DECODED_FRAME`] bytes of output.
    fn step(&mut self) -> Result<Vec<u8>, BodyError> {
        let mut out = Vec::new();
        while out.len() < MAX_DECODED_FRAME
            && !self.finished
            && (!self.pending.is_empty() || self.more_output)
        {
            let before = (self.pending.len(), out.len());
            match &mut self.decoder {
                Decoder::Gzip(gzip) => match gzip {
                    Gzip::Header(header) => {
                        let had = header.len();
                        header.extend_from_slice(&self.pending);
                        match gzip_header(header)? {
                            Some(len) => {
                                self.pending.advance(len - had);
                                *gzip = Gzip::Data(Box::new(Decompress::new(false)), Crc::new());
                            }
                            None if header.len() > MAX_GZIP_HEADER => {
                                return Err(corrupt("the gzip header is too long"))
                            }
                            None => self.pending.clear(),
                        }
                    }
                    Gzip::Data(deflate, crc) => {
                        if inflate(
                            deflate,
                            &mut self.pending,
                            &mut self.buffer,
                            &mut out,
                            Some(crc),
                        )? {
                            *gzip = Gzip::Trailer(
                                Vec::with_capacity(8),
                                std::mem::replace(crc, Crc::new()),
                            );
                        }
                    }
                    Gzip::Trailer(trailer, crc) => {
                        let take = self.pending.len().min(8 - trailer.len());
                        trailer.extend_from_slice(&self.pending[..take]);
                        self.pending.advance(take);
                        if trailer.len() == 8 {
                            let sum = u32::from_le_bytes([
                                trailer[0], trailer[1], trailer[2], trailer[3],
                            ]);
                            let len = u32::from_le_bytes([
                                trailer[4], trailer[5], trailer[6], trailer[7],
                            ]);
                            if sum != crc.sum() || len != crc.amount() {
                                return Err(corrupt("the gzip body fails its CRC check"));
                            }
                            self.finished = true;
                        }
                    }
                },
                Decoder::Deflate(deflate) => {
                    let deflate = match deflate {
                        Some(deflate) => deflate,
                        None if self.pending.len() < 2 && !self.input_ended => break,
                        None => {
                            let zlib = self.pending.len() >= 2
                                && is_zlib_header(self.pending[0], self.pending[1]);
                            deflate.insert(Decompress::new(zlib))
                        }
                    };
                    if inflate(deflate, &mut self.pending, &mut self.buffer, &mut out, None)? {
                        self.finished = true;
                    }
                }
                Decoder::Brotli(state) => {
                    let (mut available_in, mut input_offset) = (self.pending.len(), 0);
                    let (mut available_out, mut output_offset, mut total) =
                        (self.buffer.len(), 0, 0);
                    let result = BrotliDecompressStream(
                        &mut available_in,
                        &mut input_offset,
                        &self.pending,
                        &mut available_out,
                        &mut output_offset,
                        &mut self.buffer,
                        &mut total,
                        state,
                    );
                    out.extend_from_slice(&self.buffer[..output_offset]);
                    self.pending.advance(input_offset);
                    match result {
                        BrotliResult::ResultSuccess => self.finished = true,
                        BrotliResult::ResultFailure => {
                            return Err(corrupt("the brotli body does not decode"))
                        }
                        BrotliResult::NeedsMoreInput | BrotliResult::NeedsMoreOutput => {}
                    }
                }
            }
            self.more_output = out.len() - before.1 == self.buffer.len();
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

    /// The encoded body ended: an error if its encoding did not.
    fn finish(&mut self) -> Result<(), BodyError> {
        if self.finished || !self.any_input {
            self.finished = true;
            return Ok(());
        }
        Err(corrupt(match self.decoder {
            Decoder::Gzip(_) => "the gzip body ended before its end",
            Decoder::Deflate(_) => "the deflate body ended before its end",
            Decoder::Brotli(_) => "the brotli body ended before its end",
        }))
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
                    Ok(()) => return Poll::Ready(None),
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
    use std::io::Write;

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
                largest < MAX_DECODED_FRAME + OUTPUT_STEP,
                "{coding:?}: {largest}"
            );
        }
    }

    /// A gzip header with a name, a comment and extra fields is read past, split anywhere; a body whose CRC or length does not match is an error.
    #[test]
    fn gzip_headers_with_every_field_decode_and_a_bad_crc_does_not() {
        let data = b"{\"usage\":{\"total_tokens\":30}}".repeat(10);
        let mut e = flate2::GzBuilder::new()
            .filename("answer.json")
            .comment("from the upstream")
            .extra(vec![1, 2, 3, 4])
            .write(Vec::new(), flate2::Compression::default());
        e.write_all(&data).unwrap();
        let mut wire = e.finish().unwrap();
        for cut in 0..wire.len() {
            let (got, _) = block_on(decode(ContentCoding::Gzip, &wire, &[cut])).unwrap();
            assert_eq!(got, data, "cut at {cut}");
        }
        let at = wire.len() - 6;
        wire[at] ^= 1;
        let e = block_on(decode(ContentCoding::Gzip, &wire, &[])).unwrap_err();
        assert!(e.contains("CRC"), "{e}");
        assert!(
            gzip_header(b"\x1f\x8b\x08\x00").unwrap().is_none(),
            "not all there"
        );
        assert!(gzip_header(b"PK\x03\x04 not gzip at all").is_err());
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
