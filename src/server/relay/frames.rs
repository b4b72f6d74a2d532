//! How one direction of a relay session travels over core NATS: its frames numbered, each in
//! one message or, when large, in parts, and the checker that rebuilds them on the other end.
//!
//! Owns the per-direction state of one relay session: the next sequence number to send
//! ([`Outbound`]) and the one expected with the part of a frame received so far
//! ([`Inbound`]). Core NATS delivers at most once: a message lost on the way (a NATS server
//! restarting, a slow consumer dropped) would otherwise be a silent gap, or, for a middle
//! part, a spliced frame. Every message of a frame carries `Map-Relay-Seq` (1, 2, ... per
//! direction of a relay session, each part its own number) and, for a part, `Map-Relay-Part`
//! (`i/n`); [`Inbound::take`] refuses anything but the next number and the next part, and the
//! caller ends the relay session (the client's connection is closed and resumes: nothing is
//! spliced, nothing skipped in silence). A loss at the end of a burst has no next message to
//! give it away: once the frames pause for [`MARK_AFTER`], the sender says how many it sent
//! (a *mark*, `Map-Relay: mark`, [`forward`]), which [`Inbound::mark`] checks.
//!
//! Frames that are ready together travel together: [`forward`] puts the frames its stream has
//! ready at once (at most [`BATCH_FRAMES`], [`BATCH_BYTES`] in all) into one message, a *batch*
//! whose `Map-Relay-Batch` header lists each frame's length in bytes (`12,340,7`), so a burst
//! of deliveries to one connection costs one NATS message instead of one per frame, on the
//! sender, in nats-server and on the receiver. A batch is numbered once; it is taken whole or
//! refused whole (lengths that do not add up to its payload, too many frames, a frame that is
//! not UTF-8). An end sends batches only to an end that said it reads them ([`READS_BATCHES`]:
//! the standby on its `open`, the writer on its first message), so a node of an older build
//! on either end still gets one frame per message.

/// The control header of a relay's messages (`open`, `close`, `closed`, `lost`, [`MARK`]).
pub const HEADER: &str = "Map-Relay";
/// A mark: `Map-Relay-Seq` says how many messages were sent so far.
pub const MARK: &str = "mark";
/// How long after its last frame a direction that sent frames says how many it sent.
pub const MARK_AFTER: std::time::Duration = std::time::Duration::from_millis(200);
/// The message's number within its direction of the relay session.
pub const SEQ: &str = "Map-Relay-Seq";
/// The part of a frame a message carries, as `i/n`, when the frame is larger than one NATS
/// message may be (`max_payload`, 1 MiB by default, which a frame as large as the router
/// accepts exceeds with its envelope).
pub const PART: &str = "Map-Relay-Part";
/// The most bytes of a frame in one message.
pub const PART_BYTES: usize = 256 * 1024;
/// The largest frame reassembled (bounds what a relay may buffer).
pub const MAX_FRAME_BYTES: usize = 64 << 20;
/// A batch: the message carries whole frames, of these lengths in bytes, in order (`a,b,c`).
pub const BATCH: &str = "Map-Relay-Batch";
/// Says that the end sending it reads batches: on a standby's `open`, and on the writer's
/// first message of a relay session.
pub const READS_BATCHES: &str = "Map-Relay-Batches";
/// The most frames in one batch.
pub const BATCH_FRAMES: usize = 64;
/// The most bytes of frames in one batch; a frame this large or larger travels alone.
pub const BATCH_BYTES: usize = 64 * 1024;

/// Whether `msg` says its sender reads batches ([`READS_BATCHES`]).
pub fn says_it_reads_batches(msg: &async_nats::Message) -> bool {
    msg.headers
        .as_ref()
        .is_some_and(|h| h.get(READS_BATCHES).is_some())
}

/// The sending end of one direction: numbers the messages.
#[derive(Debug, Default)]
pub struct Outbound {
    sent: u64,
    /// Say [`READS_BATCHES`] on the next message (the writer's first of a relay session).
    announce: bool,
}

impl Outbound {
    /// An end that says [`READS_BATCHES`] on its first message.
    pub fn announcing() -> Self {
        Self {
            sent: 0,
            announce: true,
        }
    }

    /// The headers of the next message: its number, and the announcement once.
    fn next_headers(&mut self) -> async_nats::HeaderMap {
        self.sent += 1;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(SEQ, self.sent.to_string().as_str());
        if std::mem::take(&mut self.announce) {
            headers.insert(READS_BATCHES, "1");
        }
        headers
    }

    /// The messages (headers and payload) that carry `frame`, numbered after those before.
    pub fn messages(&mut self, frame: String) -> Vec<(async_nats::HeaderMap, bytes::Bytes)> {
        let bytes = bytes::Bytes::from(frame);
        let parts = bytes.len().div_ceil(PART_BYTES).max(1);
        (0..parts)
            .map(|i| {
                let mut headers = self.next_headers();
                if parts > 1 {
                    headers.insert(PART, format!("{}/{parts}", i + 1).as_str());
                }
                let end = ((i + 1) * PART_BYTES).min(bytes.len());
                (headers, bytes.slice(i * PART_BYTES..end))
            })
            .collect()
    }

    /// The one message that carries `frames` (two or more, each shorter than [`BATCH_BYTES`]
    /// and [`BATCH_FRAMES`] at most, as [`batches`] groups them) as a batch.
    pub fn batch(&mut self, frames: &[String]) -> (async_nats::HeaderMap, bytes::Bytes) {
        let mut headers = self.next_headers();
        let mut lengths = String::with_capacity(frames.len() * 4);
        let mut payload = Vec::with_capacity(frames.iter().map(String::len).sum());
        for (i, frame) in frames.iter().enumerate() {
            if i > 0 {
                lengths.push(',');
            }
            lengths.push_str(&frame.len().to_string());
            payload.extend_from_slice(frame.as_bytes());
        }
        headers.insert(BATCH, lengths.as_str());
        (headers, payload.into())
    }

    /// The mark of what was sent so far.
    pub fn mark(&self) -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(HEADER, MARK);
        headers.insert(SEQ, self.sent.to_string().as_str());
        headers
    }

    /// Publishes `frame` on `subject` (core NATS keeps one publisher's messages in order).
    ///
    /// # Errors
    /// NATS refused a message; the relay ends.
    pub async fn publish(
        &mut self,
        client: &async_nats::Client,
        subject: &str,
        frame: String,
    ) -> Result<(), async_nats::PublishError> {
        for (headers, payload) in self.messages(frame) {
            client
                .publish_with_headers(subject.to_owned(), headers, payload)
                .await?;
        }
        Ok(())
    }
}

/// `ready` (frames in order) grouped as they travel: runs of frames that fit one batch
/// ([`BATCH_FRAMES`], [`BATCH_BYTES`]), a frame of [`BATCH_BYTES`] or more alone. A group of
/// one is sent as a plain frame.
pub fn batches(ready: Vec<String>) -> Vec<Vec<String>> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    let mut bytes = 0;
    for frame in ready {
        let fits = groups.last().is_some_and(|g| {
            g.len() < BATCH_FRAMES
                && g[0].len() < BATCH_BYTES
                && frame.len() < BATCH_BYTES
                && bytes + frame.len() <= BATCH_BYTES
        });
        if fits {
            bytes += frame.len();
            groups.last_mut().expect("a group").push(frame);
        } else {
            bytes = frame.len();
            groups.push(vec![frame]);
        }
    }
    groups
}

/// Publishes every frame of `frames` on `subject`, numbered, and a mark once they pause for
/// [`MARK_AFTER`] after some were sent. Frames the stream has ready together go as batches
/// while `peer_reads_batches` says the other end reads them; `out` is this direction's
/// numbering ([`Outbound::announcing`] on the writer). Returns when `frames` ends.
///
/// # Errors
/// NATS refused a message; the relay ends.
pub async fn forward(
    client: &async_nats::Client,
    subject: &str,
    frames: impl futures::Stream<Item = String> + Unpin,
    mut out: Outbound,
    peer_reads_batches: &std::sync::atomic::AtomicBool,
) -> Result<(), async_nats::PublishError> {
    use futures::StreamExt as _;
    let mut frames = frames.ready_chunks(BATCH_FRAMES);
    let mut marked = 0;
    loop {
        let ready = if out.sent > marked {
            match tokio::time::timeout(MARK_AFTER, frames.next()).await {
                Ok(ready) => ready,
                Err(_) => {
                    client
                        .publish_with_headers(subject.to_owned(), out.mark(), bytes::Bytes::new())
                        .await?;
                    marked = out.sent;
                    continue;
                }
            }
        } else {
            frames.next().await
        };
        let Some(ready) = ready else {
            return Ok(());
        };
        if ready.len() == 1 || !peer_reads_batches.load(std::sync::atomic::Ordering::Relaxed) {
            for frame in ready {
                out.publish(client, subject, frame).await?;
            }
            continue;
        }
        for mut group in batches(ready) {
            if group.len() == 1 {
                let frame = group.pop().expect("one frame");
                out.publish(client, subject, frame).await?;
            } else {
                let (headers, payload) = out.batch(&group);
                client
                    .publish_with_headers(subject.to_owned(), headers, payload)
                    .await?;
            }
        }
    }
}

/// The receiving end of one direction: checks the numbers and rebuilds the frames.
#[derive(Debug, Default)]
pub struct Inbound {
    /// The number of the last message taken.
    taken: u64,
    /// The parts of a frame so far: their bytes, how many, and of how many.
    buf: Vec<u8>,
    parts: usize,
    of: usize,
}

impl Inbound {
    /// The frames `msg` completes, in order (none for a part of a frame, one for a frame,
    /// several for a batch); `Err` (the relay session must end) for a message out of
    /// sequence, a part out of order, a frame cut short or one too large, or a batch whose
    /// lengths do not describe its payload.
    pub fn take_message(&mut self, msg: &async_nats::Message) -> Result<Vec<String>, &'static str> {
        let header = |name: &str| {
            msg.headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(async_nats::HeaderValue::as_str)
        };
        if let Some(lengths) = header(BATCH) {
            if header(PART).is_some() {
                return Err("a batch that is also a part");
            }
            return self.take_batch(header(SEQ), lengths, &msg.payload);
        }
        Ok(self
            .take(header(SEQ), header(PART), &msg.payload)?
            .into_iter()
            .collect())
    }

    /// The frames of a batch (`lengths`: the `Map-Relay-Batch` header), checked whole before
    /// any is handed on.
    pub fn take_batch(
        &mut self,
        seq: Option<&str>,
        lengths: &str,
        payload: &[u8],
    ) -> Result<Vec<String>, &'static str> {
        self.next(seq)?;
        if self.parts != 0 {
            return Err("a frame's parts were cut short");
        }
        let mut frames = Vec::new();
        let mut at = 0usize;
        for length in lengths.split(',') {
            if frames.len() == BATCH_FRAMES {
                return Err("a batch of too many frames");
            }
            let end = length
                .parse::<usize>()
                .ok()
                .and_then(|n| at.checked_add(n))
                .filter(|end| *end <= payload.len())
                .ok_or("a batch whose lengths do not fit its payload")?;
            let frame =
                std::str::from_utf8(&payload[at..end]).map_err(|_| "a frame that is not UTF-8")?;
            frames.push(frame.to_owned());
            at = end;
        }
        if at != payload.len() || frames.len() < 2 {
            return Err("a batch whose lengths do not fit its payload");
        }
        Ok(frames)
    }

    /// Takes the message numbered `seq`: `Err` unless it is the next.
    fn next(&mut self, seq: Option<&str>) -> Result<(), &'static str> {
        let seq = seq
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or("a relayed message without its sequence number")?;
        if seq != self.taken + 1 {
            return Err(if seq > self.taken + 1 {
                "a relayed message was lost (a gap in the sequence)"
            } else {
                "a relayed message came again or out of order"
            });
        }
        self.taken = seq;
        Ok(())
    }

    /// Checks a mark (`seq`: how many messages the other end sent): `Err` when some of them
    /// never came.
    pub fn mark(&self, seq: Option<&str>) -> Result<(), &'static str> {
        let seq = seq
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or("a mark without its sequence number")?;
        if seq != self.taken {
            return Err(if seq > self.taken {
                "a relayed message was lost (a gap in the sequence)"
            } else {
                "a relayed message came again or out of order"
            });
        }
        Ok(())
    }

    /// The mark of `msg` checked ([`Inbound::mark`]).
    pub fn mark_message(&self, msg: &async_nats::Message) -> Result<(), &'static str> {
        self.mark(
            msg.headers
                .as_ref()
                .and_then(|h| h.get(SEQ))
                .map(async_nats::HeaderValue::as_str),
        )
    }

    /// As [`Inbound::take_message`], from the message's `Map-Relay-Seq` and `Map-Relay-Part`
    /// headers and its payload.
    pub fn take(
        &mut self,
        seq: Option<&str>,
        part: Option<&str>,
        payload: &[u8],
    ) -> Result<Option<String>, &'static str> {
        self.next(seq)?;
        let Some(part) = part else {
            if self.parts != 0 {
                return Err("a frame's parts were cut short");
            }
            return String::from_utf8(payload.to_vec())
                .map(Some)
                .map_err(|_| "a frame that is not UTF-8");
        };
        let (i, n) = part
            .split_once('/')
            .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
            .filter(|(i, n)| *i >= 1 && i <= n)
            .ok_or("an unreadable part header")?;
        if i != self.parts + 1 || (self.parts != 0 && n != self.of) {
            return Err("a frame's parts were cut short");
        }
        if self.buf.len() + payload.len() > MAX_FRAME_BYTES {
            return Err("a frame larger than a relay carries");
        }
        self.buf.extend_from_slice(payload);
        self.parts = i;
        self.of = n;
        if i < n {
            return Ok(None);
        }
        self.parts = 0;
        String::from_utf8(std::mem::take(&mut self.buf))
            .map(Some)
            .map_err(|_| "a frame that is not UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The (seq, part, payload) of each message that carries `frames`.
    fn sent(frames: &[String]) -> Vec<(String, Option<String>, Vec<u8>)> {
        let mut out = Outbound::default();
        frames
            .iter()
            .flat_map(|f| out.messages(f.clone()))
            .map(|(h, p)| {
                (
                    h.get(SEQ).unwrap().as_str().to_owned(),
                    h.get(PART).map(|v| v.as_str().to_owned()),
                    p.to_vec(),
                )
            })
            .collect()
    }

    fn received(
        messages: &[(String, Option<String>, Vec<u8>)],
    ) -> (Vec<String>, Option<&'static str>) {
        let mut inbound = Inbound::default();
        let mut frames = Vec::new();
        for (seq, part, payload) in messages {
            match inbound.take(Some(seq), part.as_deref(), payload) {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => {}
                Err(why) => return (frames, Some(why)),
            }
        }
        (frames, None)
    }

    fn big(c: char) -> String {
        c.to_string().repeat(3 * PART_BYTES - 10)
    }

    #[test]
    fn frames_small_and_split_arrive_whole_and_in_order() {
        let frames = vec!["a".to_owned(), big('x'), "b".to_owned(), big('y')];
        let messages = sent(&frames);
        assert_eq!(messages.len(), 1 + 3 + 1 + 3);
        let seqs: Vec<&str> = messages.iter().map(|m| m.0.as_str()).collect();
        assert_eq!(seqs, ["1", "2", "3", "4", "5", "6", "7", "8"]);
        assert_eq!(messages[1].1.as_deref(), Some("1/3"));
        assert_eq!(received(&messages), (frames, None));
    }

    #[test]
    fn a_lost_middle_part_is_never_spliced() {
        let frames = vec![big('x'), "after".to_owned()];
        let mut messages = sent(&frames);
        messages.remove(1);
        let (got, why) = received(&messages);
        assert!(got.is_empty(), "nothing of the cut frame is handed on");
        assert_eq!(
            why,
            Some("a relayed message was lost (a gap in the sequence)")
        );
        // Even with the numbers made to look whole, the part order gives it away.
        let mut renumbered = sent(&frames);
        renumbered.remove(1);
        for (i, m) in renumbered.iter_mut().enumerate() {
            m.0 = (i + 1).to_string();
        }
        let (got, why) = received(&renumbered);
        assert!(got.is_empty());
        assert_eq!(why, Some("a frame's parts were cut short"));
    }

    #[test]
    fn a_lost_frame_is_a_gap_not_a_silent_skip() {
        let frames: Vec<String> = (0..5).map(|i| format!("frame {i}")).collect();
        let mut messages = sent(&frames);
        messages.remove(2);
        let (got, why) = received(&messages);
        assert_eq!(got, frames[..2]);
        assert_eq!(
            why,
            Some("a relayed message was lost (a gap in the sequence)")
        );
        // The last frame lost: nothing wrong is handed on, and the mark that follows the
        // burst gives the loss away (`a_mark_gives_away_a_loss_at_the_end_of_a_burst`).
        let mut messages = sent(&frames);
        messages.pop();
        assert_eq!(received(&messages), (frames[..4].to_vec(), None));
    }

    #[test]
    fn a_mark_gives_away_a_loss_at_the_end_of_a_burst() {
        let frames = ["a".to_owned(), big('x')];
        let mut out = Outbound::default();
        let messages: Vec<_> = frames
            .iter()
            .flat_map(|f| out.messages(f.clone()))
            .collect();
        let mark = out.mark();
        assert_eq!(mark.get(HEADER).unwrap().as_str(), MARK);
        let mark = mark.get(SEQ).unwrap().as_str().to_owned();
        assert_eq!(mark, "4");
        let take = |n: usize| {
            let mut inbound = Inbound::default();
            for (h, p) in &messages[..n] {
                let seq = h.get(SEQ).map(async_nats::HeaderValue::as_str);
                let part = h.get(PART).map(async_nats::HeaderValue::as_str);
                inbound.take(seq, part, p).unwrap();
            }
            inbound
        };
        assert_eq!(take(4).mark(Some(&mark)), Ok(()));
        // The last part lost, or the last two: the frame was never handed on, the mark says so.
        for n in [3, 2, 1] {
            assert_eq!(
                take(n).mark(Some(&mark)),
                Err("a relayed message was lost (a gap in the sequence)"),
                "{n}"
            );
        }
        assert_eq!(
            take(4).mark(Some("3")),
            Err("a relayed message came again or out of order")
        );
        assert_eq!(
            take(4).mark(None),
            Err("a mark without its sequence number")
        );
    }

    #[test]
    fn reordered_or_repeated_messages_end_the_relay() {
        let frames: Vec<String> = (0..3).map(|i| format!("frame {i}")).collect();
        let mut messages = sent(&frames);
        messages.swap(1, 2);
        let (got, why) = received(&messages);
        assert_eq!(got, frames[..1]);
        assert_eq!(
            why,
            Some("a relayed message was lost (a gap in the sequence)")
        );
        let mut messages = sent(&frames);
        let again = messages[1].clone();
        messages.insert(2, again);
        let (got, why) = received(&messages);
        assert_eq!(got, frames[..2]);
        assert_eq!(why, Some("a relayed message came again or out of order"));
        // Parts swapped.
        let mut messages = sent(&[big('z')]);
        messages.swap(1, 2);
        assert_eq!(received(&messages).0, Vec::<String>::new());
        assert!(received(&messages).1.is_some());
    }

    #[test]
    fn unnumbered_or_oversized_input_is_refused() {
        let mut inbound = Inbound::default();
        assert_eq!(
            inbound.take(None, None, b"x"),
            Err("a relayed message without its sequence number")
        );
        let mut inbound = Inbound::default();
        assert_eq!(
            inbound.take(Some("1"), Some("0/2"), b"x"),
            Err("an unreadable part header")
        );
        let mut inbound = Inbound::default();
        let n = MAX_FRAME_BYTES / PART_BYTES + 2;
        let chunk = vec![b'a'; PART_BYTES];
        let mut last = Ok(None);
        for i in 1..=n {
            last = inbound.take(Some(&i.to_string()), Some(&format!("{i}/{n}")), &chunk);
            if last.is_err() {
                break;
            }
        }
        assert_eq!(last, Err("a frame larger than a relay carries"));
    }

    fn seq_of(h: &async_nats::HeaderMap) -> Option<&str> {
        h.get(SEQ).map(async_nats::HeaderValue::as_str)
    }

    #[test]
    fn frames_ready_together_are_grouped_within_the_bounds() {
        let small = |i: usize| format!("{{\"frame\":{i}}}");
        // Fewer than a batch holds: one group, in order.
        let ready: Vec<String> = (0..5).map(small).collect();
        assert_eq!(batches(ready.clone()), vec![ready]);
        // More frames than a batch holds: full groups, then the rest.
        let ready: Vec<String> = (0..BATCH_FRAMES + 3).map(small).collect();
        let groups = batches(ready.clone());
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].len(), BATCH_FRAMES);
        assert_eq!(groups.concat(), ready);
        // A frame of BATCH_BYTES or more travels alone; bytes bound a group.
        let large = "x".repeat(BATCH_BYTES);
        let half = "h".repeat(BATCH_BYTES / 2);
        let ready = vec![
            small(0),
            large.clone(),
            small(1),
            half.clone(),
            half.clone(),
            small(2),
        ];
        let groups = batches(ready.clone());
        assert_eq!(groups.concat(), ready);
        assert!(groups.iter().any(|g| g == &vec![large.clone()]));
        for g in &groups {
            let bytes: usize = g.iter().map(String::len).sum();
            assert!(g.len() == 1 || bytes <= BATCH_BYTES, "{bytes}");
            assert!(g.len() <= BATCH_FRAMES);
        }
    }

    #[test]
    fn a_batch_arrives_as_its_frames_numbered_with_the_plain_ones() {
        // Frames with multi-byte characters, braces and newlines (a participant's JSON
        // passes byte for byte, pretty-printed or not).
        let frames: Vec<String> = vec![
            "{\"a\":\"é\u{1F600}\"}".into(),
            "{\n  \"b\": [1, 2]\n}".into(),
            String::new(),
            "{\"c\":\",\"}".into(),
        ];
        let mut out = Outbound::announcing();
        let first = out.messages("first".into());
        let (headers, payload) = out.batch(&frames);
        let last = out.messages("last".into());
        assert_eq!(
            first[0].0.get(READS_BATCHES).map(|v| v.as_str()),
            Some("1"),
            "the first message says so"
        );
        assert!(headers.get(READS_BATCHES).is_none(), "only the first");
        let lengths = headers.get(BATCH).unwrap().as_str().to_owned();
        assert_eq!(seq_of(&headers), Some("2"));
        let mut inbound = Inbound::default();
        let (h, p) = &first[0];
        assert_eq!(inbound.take(seq_of(h), None, p), Ok(Some("first".into())));
        assert_eq!(
            inbound.take_batch(seq_of(&headers), &lengths, &payload),
            Ok(frames.clone())
        );
        let (h, p) = &last[0];
        assert_eq!(inbound.take(seq_of(h), None, p), Ok(Some("last".into())));
        // A mark counts the batch once.
        assert_eq!(inbound.mark(Some("3")), Ok(()));
        // The batch lost: the next plain frame gives it away.
        let mut inbound = Inbound::default();
        let (h, p) = &first[0];
        inbound.take(seq_of(h), None, p).unwrap();
        let (h, p) = &last[0];
        assert_eq!(
            inbound.take(seq_of(h), None, p),
            Err("a relayed message was lost (a gap in the sequence)")
        );
    }

    #[test]
    fn a_batch_that_does_not_describe_its_payload_is_refused_whole() {
        let take = |lengths: &str, payload: &[u8]| {
            Inbound::default().take_batch(Some("1"), lengths, payload)
        };
        let misfit = Err("a batch whose lengths do not fit its payload");
        assert_eq!(take("2,3", b"ab"), misfit, "shorter than said");
        assert_eq!(take("2,3", b"abcdefg"), misfit, "bytes left over");
        assert_eq!(take("2,-1", b"ab"), misfit);
        assert_eq!(take("2,x", b"abc"), misfit);
        assert_eq!(take("", b""), misfit);
        assert_eq!(take("2,,1", b"abc"), misfit);
        assert_eq!(take(&format!("1,{}", u64::MAX), b"ab"), misfit, "overflow");
        assert_eq!(take("3", b"abc"), misfit, "a batch of one frame");
        // A character cut between two frames.
        let bytes = "é".as_bytes();
        assert_eq!(take("1,1", bytes), Err("a frame that is not UTF-8"));
        let many = vec!["1"; BATCH_FRAMES + 1].join(",");
        assert_eq!(
            take(&many, &[b'a'; BATCH_FRAMES + 1]),
            Err("a batch of too many frames")
        );
        assert_eq!(
            Inbound::default().take_batch(None, "1,1", b"ab"),
            Err("a relayed message without its sequence number")
        );
        // In the middle of a frame's parts.
        let mut inbound = Inbound::default();
        inbound.take(Some("1"), Some("1/2"), b"a").unwrap();
        assert_eq!(
            inbound.take_batch(Some("2"), "1,1", b"ab"),
            Err("a frame's parts were cut short")
        );
    }
}
