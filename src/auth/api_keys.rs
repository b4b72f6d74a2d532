//! API keys: the table of accepted keys and their principals.
//!
//! Format (a file, an environment variable, or `--api-keys`): one entry per line (in an
//! environment variable, commas separate entries too), `KEY [PRINCIPAL]`, blank lines and
//! `#` comments ignored. A key without a principal gets `api-key:<first 12 hex digits of its
//! SHA-256>`, which identifies it in logs and permissions without revealing it.
//!
//! Only SHA-256 digests of the keys are kept. A presented key is hashed and compared with every
//! digest in constant time ([`subtle`]), so neither the comparison's duration nor an early exit
//! tells an attacker how much of a key was right.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Shortest API key accepted: a key an attacker could guess is no key.
pub const MIN_API_KEY_LEN: usize = 16;

#[derive(Clone)]
struct Entry {
    digest: [u8; 32],
    principal: String,
}

/// The accepted keys.
#[derive(Clone, Default)]
pub struct ApiKeys {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys")
            .field("keys", &self.entries.len())
            .finish()
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl ApiKeys {
    /// Adds the entries of `text` (see the module docs); `source` names it in errors, and
    /// `commas` says whether commas separate entries too (environment variables).
    ///
    /// # Errors
    /// A malformed line, a key shorter than [`MIN_API_KEY_LEN`], or a key listed twice. The
    /// message names the source and line, never the key.
    pub fn add(&mut self, text: &str, source: &str, commas: bool) -> Result<(), String> {
        for (n, raw) in text.lines().enumerate() {
            let pieces: Vec<&str> = if commas {
                raw.split(',').collect()
            } else {
                vec![raw]
            };
            for line in pieces {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let at = || format!("{source}, line {}", n + 1);
                let mut words = line.split_whitespace();
                let (Some(key), principal, None) = (words.next(), words.next(), words.next())
                else {
                    return Err(format!(
                        "{}: expected `KEY [PRINCIPAL]` (keys and principals contain no spaces)",
                        at()
                    ));
                };
                if key.len() < MIN_API_KEY_LEN {
                    return Err(format!(
                        "{}: the key is shorter than {MIN_API_KEY_LEN} characters",
                        at()
                    ));
                }
                let d = digest(key);
                if self.entries.iter().any(|e| e.digest == d) {
                    return Err(format!("{}: this key is listed twice", at()));
                }
                let principal = principal.map_or_else(|| default_principal(&d), str::to_owned);
                self.entries.push(Entry {
                    digest: d,
                    principal,
                });
            }
        }
        Ok(())
    }

    /// The principal of `key`, if it is one of ours.
    pub fn lookup(&self, key: &str) -> Option<&str> {
        let d = digest(key);
        let mut found = None;
        // NB: no early exit: every digest is compared, in constant time.
        for e in &self.entries {
            if bool::from(e.digest.ct_eq(&d)) {
                found = Some(e.principal.as_str());
            }
        }
        found
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn default_principal(d: &[u8; 32]) -> String {
    let hex: String = d[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("api-key:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_comments_and_principals() {
        let mut k = ApiKeys::default();
        k.add(
            "# team keys\n\nk-0123456789abcdef alice\n  k-fedcba9876543210  \n",
            "/etc/keys",
            false,
        )
        .unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k.lookup("k-0123456789abcdef"), Some("alice"));
        let anon = k.lookup("k-fedcba9876543210").unwrap();
        assert!(anon.starts_with("api-key:") && anon.len() == 20, "{anon}");
        assert_eq!(k.lookup("k-0123456789abcdeF"), None);
        assert_eq!(k.lookup(""), None);
    }

    #[test]
    fn environment_entries_split_on_commas() {
        let mut k = ApiKeys::default();
        k.add(
            "k-0123456789abcdef alice,k-fedcba9876543210 bob",
            "$KEYS",
            true,
        )
        .unwrap();
        assert_eq!(k.lookup("k-fedcba9876543210"), Some("bob"));
    }

    #[test]
    fn errors_name_the_line_not_the_key() {
        let mut k = ApiKeys::default();
        let e = k
            .add("ok-0123456789abcdef a\nweak b\n", "/k", false)
            .unwrap_err();
        assert_eq!(e, "/k, line 2: the key is shorter than 16 characters");
        let e = k.add("x-0123456789abcdef a b\n", "/k2", false).unwrap_err();
        assert!(e.starts_with("/k2, line 1: expected"), "{e}");
        assert!(!e.contains("x-0123"), "{e}");
        let e = k.add("ok-0123456789abcdef c\n", "/k3", false).unwrap_err();
        assert!(e.contains("listed twice"), "{e}");
    }
}
