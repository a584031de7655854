//! The wire format against hyper's: the same upstream byte streams (recorded, odd and hostile),
//! split at every read boundary, through this client's head parser and body decoder and through
//! hyper's `client::conn::http1`: the same status, headers and body bytes, or both refuse. Where
//! the two differ by design, the case says so and checks this client's side.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method};
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::wire::{parse_head, DecodedBytes, EVERY_HEADER};

/// What a client made of an answer.
#[derive(Debug, PartialEq)]
enum Outcome {
    Answer {
        status: u16,
        headers: HeaderMap,
        body: Vec<u8>,
    },
    Refused,
}

/// `wire` as pieces cut at `cuts`.
fn pieces<'w>(wire: &'w [u8], cuts: &[usize]) -> Vec<&'w [u8]> {
    let mut out = Vec::new();
    let mut last = 0;
    for &at in cuts.iter().chain([&wire.len()]) {
        out.push(&wire[last..at]);
        last = at;
    }
    out
}

/// This client's reading of `wire`, read in `pieces`, the connection closing after the last.
fn ours(pieces: &[&[u8]]) -> Outcome {
    let mut buf = BytesMut::new();
    let mut next = pieces.iter();
    let head = loop {
        match parse_head(&mut buf, &Method::POST, EVERY_HEADER) {
            Ok(Some(head)) => break head,
            Ok(None) => match next.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => return Outcome::Refused,
            },
            Err(_) => return Outcome::Refused,
        }
    };
    let mut decoder = head.framing;
    let mut body = Vec::new();
    loop {
        let mut out = DecodedBytes::default();
        let done = match decoder.decode(&mut buf, &mut out) {
            Ok(done) => done,
            Err(_) => return Outcome::Refused,
        };
        body.extend_from_slice(&out.take().unwrap_or_default());
        if done {
            break;
        }
        match next.next() {
            Some(piece) => buf.extend_from_slice(piece),
            None if decoder.end_of_input().is_ok() => break,
            None => return Outcome::Refused,
        }
    }
    Outcome::Answer {
        status: head.status.as_u16(),
        headers: head.headers,
        body,
    }
}

/// hyper's reading of the same pieces, written one at a time to its connection, then closed.
async fn hypers(pieces: &[&[u8]]) -> Outcome {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (mut read, mut write) = tokio::io::split(server);
    let owned: Vec<Bytes> = pieces.iter().map(|p| Bytes::copy_from_slice(p)).collect();
    tokio::spawn(async move {
        let mut request = [0u8; 4096];
        // The request, then the answer piece by piece.
        let _ = read.read(&mut request).await;
        for piece in owned {
            if write.write_all(&piece).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
        let _ = write.shutdown().await;
        // Keep reading so hyper's writes never block.
        while let Ok(1..) = read.read(&mut request).await {}
    });
    let Ok((mut sender, connection)) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client)).await
    else {
        return Outcome::Refused;
    };
    tokio::spawn(connection);
    let request = http::Request::post("/")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let Ok(response) = sender.send_request(request).await else {
        return Outcome::Refused;
    };
    let (parts, body) = response.into_parts();
    match body.collect().await {
        Ok(body) => Outcome::Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: body.to_bytes().to_vec(),
        },
        Err(_) => Outcome::Refused,
    }
}

/// Answers both clients read the same way, valid, odd and hostile.
const SAME: &[&str] = &[
    // Recorded shapes: a JSON answer, an SSE stream, an error.
    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 17\r\nx-request-id: req_1\r\n\r\n{\"usage\":{\"a\":1}}",
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n9\r\ndata: b\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
    "HTTP/1.1 429 Too Many Requests\r\nretry-after: 2\r\ncontent-length: 2\r\n\r\n{}",
    // Odd but valid.
    "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nx-trailer: t\r\n\r\n",
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0000005\r\nhello\r\n0\r\n\r\n",
    "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "HTTP/1.1 200 OK\r\n\r\nbody to the close",
    "HTTP/1.0 200 OK\r\n\r\nan HTTP/1.0 body",
    "HTTP/1.1 200 OK\ncontent-length: 2\n\nok",
    "HTTP/1.1 204 No Content\r\n\r\n",
    "HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n",
    "HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n",
    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nno",
    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
    "HTTP/1.1 200 OK\r\nx-empty:\r\nx-tab:\tv\r\n\r\n",
    // Both a length and chunked: read as chunked (RFC 9112, 6.3).
    "HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    // Hostile: refused by both.
    "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!",
    "HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\nhello",
    "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello",
    "HTTP/1.1 200 OK\r\ncontent-length: 5x\r\n\r\nhello",
    "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n-1\r\nx\r\n",
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
    "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
    "HTTP/1.1 2000 OK\r\n\r\n",
    "HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
    "HTTP/1.1 200 OK\r\nx: a\x00b\r\n\r\n",
    "HTTP/1.1 200 OK\r\ncontent-length: 2",
    // HTTP/1.0 with chunked framing: faulty (RFC 9112, 6.1).
    "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "hello\r\n\r\n",
    "",
];

/// Where the two differ by design, with what this client does.
const DIFFERENT: &[(&str, &str)] = &[
    // hyper hands a 101 to the caller (for an upgrade it asked for); this client asks for none.
    (
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
        "refused",
    ),
];

/// Every case, cut into two pieces at every byte and into pieces of one byte: the same outcome
/// from both clients, whatever the read boundaries.
#[tokio::test]
async fn this_client_reads_answers_as_hyper_does_at_every_read_boundary() {
    for case in SAME {
        let wire = case.as_bytes();
        let whole = hypers(&[wire]).await;
        assert_eq!(ours(&[wire]), whole, "{case:?}");
        let bytes: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(ours(&bytes), whole, "{case:?} a byte at a time");
        assert_eq!(
            hypers(&bytes).await,
            whole,
            "{case:?} a byte at a time (hyper)"
        );
        for cut in 0..=wire.len() {
            let split = pieces(wire, &[cut]);
            assert_eq!(ours(&split), whole, "{case:?} cut at {cut}");
        }
    }
    for (case, what) in DIFFERENT {
        let wire = case.as_bytes();
        assert_ne!(
            hypers(&[wire]).await,
            Outcome::Refused,
            "hyper answers {case:?}"
        );
        assert_eq!(*what, "refused");
        for cut in 0..=wire.len() {
            assert_eq!(
                ours(&pieces(wire, &[cut])),
                Outcome::Refused,
                "{case:?} cut at {cut}"
            );
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Generated answers (a status, a few headers, a body framed by length, chunks or the
    /// close, with noise bytes flipped in), cut at random read boundaries: the same outcome.
    #[test]
    fn generated_answers_read_the_same(
        status in proptest::sample::select(vec![200u16, 201, 204, 304, 400, 429, 500, 503]),
        framing in 0..3u8,
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), 0..5),
        noise in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 0..2),
        cuts in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 0..6),
    ) {
        let body: Vec<u8> = chunks.concat();
        let mut wire = format!("HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n").into_bytes();
        match framing {
            0 => wire.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes()),
            1 => wire.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n"),
            _ => wire.extend_from_slice(b"\r\n"),
        }
        if framing == 1 {
            for c in chunks.iter().filter(|c| !c.is_empty()) {
                wire.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                wire.extend_from_slice(c);
                wire.extend_from_slice(b"\r\n");
            }
            wire.extend_from_slice(b"0\r\n\r\n");
        } else {
            wire.extend_from_slice(&body);
        }
        for (at, byte) in &noise {
            let at = at.index(wire.len());
            wire[at] = *byte;
        }
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        at.sort_unstable();
        let split = pieces(&wire, &at);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let theirs = runtime.block_on(hypers(&split));
        let mine = ours(&split);
        // A 101 made by the noise differs by design (above).
        let by_design = wire.starts_with(b"HTTP/1.1 101");
        if !by_design {
            proptest::prop_assert_eq!(mine, theirs, "{:?}", String::from_utf8_lossy(&wire));
        }
    }
}
