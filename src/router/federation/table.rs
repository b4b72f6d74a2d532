//! [`Links`]: the connected inbound peer links, by system id and by session.

use crate::protocol::ids::SessionId;
use crate::router::ids::IdMap;

/// Most peer links at once (a bound when authentication is off and any gateway may link).
pub const MAX_LINKS: usize = 1024;

/// One connected link.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Link {
    session: SessionId,
    /// The principal id its session authenticated as (`None` with authentication off).
    principal: Option<String>,
    /// The endpoint it announced (recorded, not dialled).
    endpoint: String,
}

/// Why a link was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Another principal's session speaks for that system.
    Taken,
    /// [`MAX_LINKS`] links already.
    Full,
}

/// The connected inbound peer links.
#[derive(Debug, Default)]
pub struct Links {
    by_system: IdMap<String, Link>,
    by_session: IdMap<SessionId, String>,
}

impl Links {
    /// Records that `session` (of `principal`) speaks for `system`. A session speaks for one
    /// system (linking another replaces its previous one); a system's link moves to a new
    /// session only of the same principal.
    ///
    /// # Errors
    /// [`Refused`] when another principal holds the system or the table is full.
    pub fn link(
        &mut self,
        system: &str,
        session: &SessionId,
        principal: Option<&str>,
        endpoint: &str,
    ) -> Result<(), Refused> {
        match self.by_system.get(system) {
            Some(l) if l.principal.as_deref() != principal => return Err(Refused::Taken),
            None if self.by_system.len() >= MAX_LINKS && !self.by_session.contains_key(session) => {
                return Err(Refused::Full)
            }
            _ => {}
        }
        self.session_gone(session);
        if let Some(old) = self.by_system.remove(system) {
            self.by_session.remove(&old.session);
        }
        self.by_system.insert(
            system.to_owned(),
            Link {
                session: session.clone(),
                principal: principal.map(str::to_owned),
                endpoint: endpoint.to_owned(),
            },
        );
        self.by_session.insert(session.clone(), system.to_owned());
        Ok(())
    }

    /// The system `session` speaks for, if it is a connected link.
    pub fn system_of(&self, session: &SessionId) -> Option<&str> {
        self.by_session.get(session).map(String::as_str)
    }

    /// The endpoint the link for `system` announced.
    pub fn endpoint_of(&self, system: &str) -> Option<&str> {
        self.by_system.get(system).map(|l| l.endpoint.as_str())
    }

    /// `session` detached: its link, if any, is gone.
    pub fn session_gone(&mut self, session: &SessionId) {
        if let Some(system) = self.by_session.remove(session) {
            self.by_system.remove(&system);
        }
    }

    /// Connected links.
    pub fn len(&self) -> usize {
        self.by_system.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_system.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_system_moves_only_to_the_same_principal_and_goes_with_its_session() {
        let (s1, s2, s3) = (
            SessionId::new("s1"),
            SessionId::new("s2"),
            SessionId::new("s3"),
        );
        let mut l = Links::default();
        l.link("alpha", &s1, Some("alpha-gw"), "wss://a").unwrap();
        assert_eq!(
            l.link("alpha", &s2, Some("mallory"), "wss://m"),
            Err(Refused::Taken)
        );
        assert_eq!(l.system_of(&s2), None);
        l.link("alpha", &s3, Some("alpha-gw"), "wss://a2").unwrap();
        assert_eq!(l.system_of(&s1), None, "the older session lost it");
        assert_eq!(l.system_of(&s3), Some("alpha"));
        assert_eq!(l.endpoint_of("alpha"), Some("wss://a2"));
        // One system per session: linking another replaces it.
        l.link("gamma", &s3, Some("alpha-gw"), "wss://g").unwrap();
        assert_eq!(l.system_of(&s3), Some("gamma"));
        assert_eq!(l.endpoint_of("alpha"), None);
        l.session_gone(&s3);
        assert!(l.is_empty());
        // Gone: another principal may take the id now.
        l.link("gamma", &s2, Some("mallory"), "wss://m").unwrap();
    }

    #[test]
    fn the_table_is_bounded() {
        let mut l = Links::default();
        for i in 0..MAX_LINKS {
            l.link(
                &format!("s{i}"),
                &SessionId::new(format!("x{i}")),
                None,
                "e",
            )
            .unwrap();
        }
        assert_eq!(
            l.link("one-more", &SessionId::new("y"), None, "e"),
            Err(Refused::Full)
        );
        // A linked session may still move to another system.
        l.link("one-more", &SessionId::new("x0"), None, "e")
            .unwrap();
        assert_eq!(l.len(), MAX_LINKS);
    }
}
