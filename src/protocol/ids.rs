//! Identifier newtypes and the ULID generator.
//!
//! Every id on the wire is a string, but each kind gets its own type so the compiler catches a
//! swapped argument (an `AgentId` passed where a `ScopeId` is wanted). String ids are
//! `Arc<str>` inside: the router clones them constantly (indexes, events, results) and a clone
//! must be a reference-count bump, not an allocation.
//!
//! Event ids are special: they are monotonic ULIDs held as `u128`, so the event log can compare
//! and binary-search them without touching strings.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
        #[serde(transparent)]
        pub struct $name(#[schemars(with = "String")] Arc<str>);

        impl $name {
            /// Wraps an existing id string.
            pub fn new(id: impl Into<Arc<str>>) -> Self {
                Self(id.into())
            }

            /// A fresh, random, time-ordered id (a ULID string).
            pub fn generate() -> Self {
                Self(Ulid::random().to_string().into())
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The shared string inside, for cheap hand-off to other id kinds.
            pub fn as_arc(&self) -> &Arc<str> {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.into())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s.into())
            }
        }
    };
}

string_id!(
    /// An agent's id (`Agent.id`). Chosen by the registering participant or generated.
    AgentId
);
string_id!(
    /// A participant's id: one connected client, agent connection, gateway or system peer.
    ParticipantId
);
string_id!(
    /// A session's id, stable across reconnects that present the resume token.
    SessionId
);
string_id!(
    /// A scope's id.
    ScopeId
);
string_id!(
    /// A subscription's id, unique within the router.
    SubscriptionId
);
string_id!(
    /// A message's id (`Message.id`, `map/send` result `messageId`).
    MessageId
);

/// Crockford base32 alphabet used by ULIDs.
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A 128-bit ULID: 48 bits of Unix milliseconds, then 80 bits of randomness (or, for monotonic
/// ids, a counter seeded from randomness).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ulid(pub u128);

impl Ulid {
    /// A ULID for the current time with fresh random bits. Not monotonic within a millisecond.
    pub fn random() -> Self {
        Self::from_parts(now_ms(), random_u128())
    }

    /// Builds a ULID from a millisecond timestamp and random bits (only the low 80 are used).
    pub fn from_parts(ms: u64, random: u128) -> Self {
        let ms = u128::from(ms & 0xFFFF_FFFF_FFFF);
        Self((ms << 80) | (random & ((1u128 << 80) - 1)))
    }

    /// The millisecond timestamp part.
    pub fn timestamp_ms(self) -> u64 {
        (self.0 >> 80) as u64
    }

    /// Writes the 26-character canonical form into `out`.
    pub fn encode(self, out: &mut [u8; 26]) {
        let mut v = self.0;
        for slot in out.iter_mut().rev() {
            *slot = CROCKFORD[(v & 31) as usize];
            v >>= 5;
        }
    }

    /// Parses the canonical form (case-insensitive; `I`/`L` read as 1 and `O` as 0, per Crockford).
    pub fn parse(s: &str) -> Option<Self> {
        let bytes = s.as_bytes();
        if bytes.len() != 26 {
            return None;
        }
        // The first character carries only 3 bits (26 * 5 = 130 > 128).
        if decode_char(bytes[0])? > 7 {
            return None;
        }
        let mut v: u128 = 0;
        for &b in bytes {
            v = (v << 5) | u128::from(decode_char(b)?);
        }
        Some(Self(v))
    }
}

fn decode_char(b: u8) -> Option<u8> {
    let c = b.to_ascii_uppercase();
    let c = match c {
        b'I' | b'L' => b'1',
        b'O' => b'0',
        other => other,
    };
    CROCKFORD.iter().position(|&x| x == c).map(|p| p as u8)
}

impl fmt::Display for Ulid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 26];
        self.encode(&mut buf);
        // The alphabet is ASCII, so this cannot fail.
        f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Ulid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Generates strictly increasing ULIDs, even within one millisecond and across a clock that
/// steps backwards. Owned by the event log's single writer, so it needs no lock.
#[derive(Debug, Default)]
pub struct MonotonicUlids {
    last: u128,
}

impl MonotonicUlids {
    /// A generator that has issued nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A generator whose next id is greater than `last` (used when reopening a log).
    pub fn starting_after(last: Ulid) -> Self {
        Self { last: last.0 }
    }

    /// The last id issued (0 before any).
    pub fn last(&self) -> u128 {
        self.last
    }

    /// The next id for time `ms`: a fresh random id if time moved forward, else `last + 1`.
    ///
    /// Randomness is drawn only when the millisecond changes: under load most ids fall in the
    /// millisecond of the previous one, and one `getrandom` syscall per event was about 4 % of
    /// the router's time in the fan-out benchmark (docs/performance.md).
    pub fn next(&mut self, ms: u64) -> Ulid {
        let ms_part = u128::from(ms & 0xFFFF_FFFF_FFFF) << 80;
        self.last = if ms_part > self.last {
            Ulid::from_parts(ms, random_u128() >> 1).0
        } else {
            self.last + 1
        };
        Ulid(self.last)
    }
}

/// An event id: a monotonic ULID, serialized as its 26-character string.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct EventId(pub Ulid);

impl EventId {
    /// Parses a wire event id.
    pub fn parse(s: &str) -> Option<Self> {
        Ulid::parse(s).map(Self)
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Serialize for EventId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; 26];
        self.0.encode(&mut buf);
        s.serialize_str(std::str::from_utf8(&buf).map_err(serde::ser::Error::custom)?)
    }
}

impl<'de> Deserialize<'de> for EventId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        EventId::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("invalid event id (not a ULID): {s}")))
    }
}

impl JsonSchema for EventId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EventId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A monotonic ULID (26 Crockford base32 characters)",
            "pattern": "^[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}$"
        })
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// 128 random bits from the operating system's generator, drawn 4 KiB at a time per thread:
/// every message id is a fresh ULID, and one `getrandom` syscall per message was about 2 % of
/// the router's CPU in the fan-out benchmark (docs/performance.md). The bytes are the kernel's,
/// used once each; none is derived from another.
pub fn random_u128() -> u128 {
    const POOL: usize = 4096;
    thread_local! {
        static BYTES: std::cell::RefCell<(Box<[u8; POOL]>, usize)> =
            std::cell::RefCell::new((Box::new([0; POOL]), POOL));
    }
    BYTES.with(|cell| {
        let (pool, at) = &mut *cell.borrow_mut();
        if *at + 16 > POOL {
            if getrandom::fill(&mut pool[..]).is_err() {
                // As before the pool: uuid's own draw (which panics if the kernel has none).
                return uuid::Uuid::new_v4().as_u128();
            }
            *at = 0;
        }
        let mut bits = [0u8; 16];
        bits.copy_from_slice(&pool[*at..*at + 16]);
        // Used once: the pool forgets what it handed out.
        pool[*at..*at + 16].fill(0);
        *at += 16;
        u128::from_le_bytes(bits)
    })
}

/// A random token string for resume tokens: 122 bits of entropy, hex encoded.
pub fn random_token(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Draws from the pool never repeat (within a thread, across its refills, and across
    /// threads, each with its own pool) and are not all-zero.
    #[test]
    fn random_bits_do_not_repeat() {
        let draw = || (0..1000).map(|_| random_u128()).collect::<Vec<_>>();
        let mut all: Vec<u128> = draw();
        all.extend(std::thread::spawn(draw).join().unwrap());
        all.extend(std::thread::spawn(draw).join().unwrap());
        assert!(all.iter().all(|x| *x != 0));
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a repeated draw");
    }

    #[test]
    fn ulid_round_trips_through_text() {
        let id = Ulid::from_parts(1_795_311_269_873, 0x1234_5678_9abc_def0_1234);
        let text = id.to_string();
        assert_eq!(text.len(), 26);
        assert_eq!(Ulid::parse(&text), Some(id));
        assert_eq!(Ulid::parse(&text.to_lowercase()), Some(id));
        assert_eq!(id.timestamp_ms(), 1_795_311_269_873);
    }

    #[test]
    fn ulid_parse_rejects_bad_input() {
        assert_eq!(Ulid::parse("short"), None);
        assert_eq!(
            Ulid::parse("8ZZZZZZZZZZZZZZZZZZZZZZZZZ"),
            None,
            "overflows 128 bits"
        );
        assert_eq!(Ulid::parse("01M80E7XZHAVPKDB4FYANTNJA!"), None);
    }

    #[test]
    fn monotonic_ids_increase_within_one_millisecond_and_when_clock_steps_back() {
        let mut g = MonotonicUlids::new();
        let mut prev = g.next(1000);
        for ms in [1000, 1000, 999, 500, 1000, 1001] {
            let next = g.next(ms);
            assert!(next > prev, "{next} must be greater than {prev}");
            prev = next;
        }
    }

    #[test]
    fn string_ids_serialize_transparently() {
        let id = AgentId::new("agent-1");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"agent-1\"");
        let back: AgentId = serde_json::from_str("\"agent-1\"").unwrap();
        assert_eq!(back, id);
    }
}
