//! NDJSON framing: one JSON value per line, with a length cap and resynchronisation.
//!
//! A decoder for byte streams (stdin, a child's stdout, a TCP socket). Unlike tokio-util's
//! `LinesCodec`, it never returns an error for bad input, because `FramedRead` ends the stream
//! after any decoder error (tokio-rs/tokio#3976). Instead:
//! - a line longer than the cap is discarded up to its newline and reported as
//!   [`InFrame::TooLarge`] (the session answers `-32600` with `id: null` and carries on);
//! - a line that is not UTF-8 is reported as [`InFrame::BadUtf8`] (answered `-32700`);
//! - blank lines (whitespace only, by Unicode's measure) are skipped, a trailing `\r` is
//!   dropped and the line is trimmed;
//! - at EOF a final unterminated line is still decoded (the SDK's reader does the same).
//!
//! The encoder writes each frame followed by `\n`. Frames are serde_json output, which never
//! contains a raw newline, so a frame is always exactly one line.

use bytes::{Buf, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::transport::connection::InFrame;

/// Default cap on one line: the same 1 MiB as a WebSocket frame.
pub const DEFAULT_MAX_LINE: usize = 1 << 20;

/// The NDJSON codec.
#[derive(Debug, Clone)]
pub struct NdjsonCodec {
    max_line: usize,
    /// Where to resume scanning for `\n` in the buffer.
    next_index: usize,
    /// Bytes of the current oversized line thrown away so far.
    discarding: Option<usize>,
}

impl NdjsonCodec {
    /// A codec that accepts lines of at most `max_line` bytes (excluding the newline).
    pub fn new(max_line: usize) -> Self {
        Self {
            max_line: max_line.max(1),
            next_index: 0,
            discarding: None,
        }
    }

    fn frame(&self, line: &[u8]) -> Option<InFrame> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > self.max_line {
            return Some(InFrame::TooLarge { len: line.len() });
        }
        match std::str::from_utf8(line) {
            // NB: blank by Unicode's measure, the one `trim` uses: a line of vertical tabs or
            // U+2028 is skipped like an empty one, not handed on as an empty frame (found by
            // the frame_decode fuzz target).
            Ok(text) if text.trim().is_empty() => None,
            Ok(text) => Some(InFrame::Text(text.trim().to_owned())),
            Err(_) => Some(InFrame::BadUtf8),
        }
    }
}

impl Default for NdjsonCodec {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LINE)
    }
}

impl Decoder for NdjsonCodec {
    type Item = InFrame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<InFrame>, Self::Error> {
        loop {
            if let Some(discarded) = self.discarding {
                match buf.iter().position(|b| *b == b'\n') {
                    Some(i) => {
                        buf.advance(i + 1);
                        self.discarding = None;
                        self.next_index = 0;
                        return Ok(Some(InFrame::TooLarge { len: discarded + i }));
                    }
                    None => {
                        self.discarding = Some(discarded + buf.len());
                        buf.clear();
                        return Ok(None);
                    }
                }
            }
            let start = self.next_index.min(buf.len());
            match buf[start..].iter().position(|b| *b == b'\n') {
                Some(offset) => {
                    let line = buf.split_to(start + offset + 1);
                    self.next_index = 0;
                    if let Some(frame) = self.frame(&line[..line.len() - 1]) {
                        return Ok(Some(frame));
                    }
                }
                None if buf.len() > self.max_line + 1 => {
                    // Too long already, and no end in sight: stop buffering it.
                    self.discarding = Some(buf.len());
                    buf.clear();
                    self.next_index = 0;
                    return Ok(None);
                }
                None => {
                    self.next_index = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<InFrame>, Self::Error> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        if let Some(discarded) = self.discarding.take() {
            return Ok(Some(InFrame::TooLarge { len: discarded }));
        }
        if buf.is_empty() {
            return Ok(None);
        }
        let line = buf.split_to(buf.len());
        self.next_index = 0;
        Ok(self.frame(&line))
    }
}

/// Writes one line per frame: a `String`, or the bytes of a frame several recipients share
/// (`SharedText`).
impl<T: AsRef<[u8]>> Encoder<T> for NdjsonCodec {
    type Error = std::io::Error;

    fn encode(&mut self, frame: T, dst: &mut BytesMut) -> Result<(), Self::Error> {
        let frame = frame.as_ref();
        dst.reserve(frame.len() + 1);
        dst.extend_from_slice(frame);
        dst.extend_from_slice(b"\n");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(codec: &mut NdjsonCodec, input: &[u8]) -> Vec<String> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(f) = codec.decode(&mut buf).unwrap() {
            out.push(describe(f));
        }
        while let Some(f) = codec.decode_eof(&mut buf).unwrap() {
            out.push(describe(f));
        }
        out
    }

    fn describe(f: InFrame) -> String {
        match f {
            InFrame::Text(t) => t,
            InFrame::TooLarge { len } => format!("<too large {len}>"),
            InFrame::BadUtf8 => "<bad utf8>".into(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn lines_blank_lines_crlf_and_final_line() {
        let mut c = NdjsonCodec::new(100);
        assert_eq!(
            decode_all(&mut c, b"{\"a\":1}\n\n  \r\n{\"b\":2}\r\n{\"c\":3}"),
            vec!["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"]
        );
    }

    #[test]
    fn oversized_lines_are_reported_and_decoding_resyncs() {
        let mut c = NdjsonCodec::new(8);
        let mut input = b"{\"ok\":1}\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 50));
        input.extend(b"\n{\"ok\":2}\n");
        assert_eq!(
            decode_all(&mut c, &input),
            vec!["{\"ok\":1}", "<too large 50>", "{\"ok\":2}"]
        );
    }

    #[test]
    fn an_oversized_line_split_across_reads_is_discarded_in_pieces() {
        let mut c = NdjsonCodec::new(8);
        let mut buf = BytesMut::from(&b"0123456789abcdef"[..]);
        assert!(c.decode(&mut buf).unwrap().is_none());
        assert!(buf.is_empty(), "nothing of it is kept");
        buf.extend_from_slice(b"ghij\n{}\n");
        assert_eq!(
            describe(c.decode(&mut buf).unwrap().unwrap()),
            "<too large 20>"
        );
        assert_eq!(describe(c.decode(&mut buf).unwrap().unwrap()), "{}");
    }

    #[test]
    fn invalid_utf8_is_reported_not_fatal() {
        let mut c = NdjsonCodec::new(100);
        assert_eq!(
            decode_all(&mut c, b"\xff\xfe\n{}\n"),
            vec!["<bad utf8>", "{}"]
        );
    }

    #[test]
    fn a_half_written_line_waits_for_the_rest() {
        let mut c = NdjsonCodec::new(100);
        let mut buf = BytesMut::from(&b"{\"par"[..]);
        assert!(c.decode(&mut buf).unwrap().is_none());
        buf.extend_from_slice(b"tial\":true}\n");
        assert_eq!(
            describe(c.decode(&mut buf).unwrap().unwrap()),
            "{\"partial\":true}"
        );
    }

    #[test]
    fn encoding_appends_a_newline() {
        let mut c = NdjsonCodec::default();
        let mut dst = BytesMut::new();
        c.encode("{}".to_owned(), &mut dst).unwrap();
        assert_eq!(&dst[..], b"{}\n");
    }
}
