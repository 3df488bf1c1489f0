//! Which node to connect to next, and after what delay: the socket-free part of
//! failover across node URLs (README, "Several nodes").

use std::time::Duration;

use crate::live::Backoff;

/// The base URLs of one or more nodes of one cluster (`http://host:port`), as
/// [`Client::builder`](crate::Client::builder) takes them: a single URL (`&str`,
/// `String`) or a list (`Vec`, array, slice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeUrls(pub(crate) Vec<String>);

impl From<&str> for NodeUrls {
    fn from(url: &str) -> Self {
        NodeUrls(vec![url.to_owned()])
    }
}

impl From<String> for NodeUrls {
    fn from(url: String) -> Self {
        NodeUrls(vec![url])
    }
}

impl From<&String> for NodeUrls {
    fn from(url: &String) -> Self {
        NodeUrls(vec![url.clone()])
    }
}

impl<S: Into<String>> From<Vec<S>> for NodeUrls {
    fn from(urls: Vec<S>) -> Self {
        NodeUrls(urls.into_iter().map(Into::into).collect())
    }
}

impl<S: Into<String>, const N: usize> From<[S; N]> for NodeUrls {
    fn from(urls: [S; N]) -> Self {
        NodeUrls(urls.into_iter().map(Into::into).collect())
    }
}

impl<S: Into<String> + Clone> From<&[S]> for NodeUrls {
    fn from(urls: &[S]) -> Self {
        NodeUrls(urls.iter().cloned().map(Into::into).collect())
    }
}

/// Round robin over the node URLs with the backoff applied per full round: after a
/// loss (or a failed connect) the next node is tried at once (a jitter below
/// `backoff.min / 2` aside, so the clients of a dead node do not all land in the same
/// instant), and the exponential backoff is waited only once every node failed in a
/// row. A dead node thus costs one quick try, not a wait; with one URL this is the old
/// behaviour exactly (a backoff before every reconnection).
#[derive(Debug, Clone)]
pub struct NodeRotation {
    urls: Vec<String>,
    index: usize,
    /// Failures since the last good connection, in the current round.
    fails_in_round: usize,
    /// Full rounds failed since the last good connection: the backoff's exponent.
    rounds: u32,
}

impl NodeRotation {
    /// # Panics
    /// Without any URL.
    pub fn new(urls: NodeUrls) -> NodeRotation {
        assert!(!urls.0.is_empty(), "an Ordo client needs at least one node URL");
        NodeRotation { urls: urls.0, index: 0, fails_in_round: 0, rounds: 0 }
    }

    /// The URL of the node in use (or being tried).
    pub fn current(&self) -> &str {
        &self.urls[self.index]
    }

    /// Every node URL, in rotation order.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// Full rounds failed since the last good connection.
    pub fn failed_rounds(&self) -> u32 {
        self.rounds
    }

    /// The node in use failed (lost, refused, or behind): moves to the next one and
    /// returns the delay before connecting to it. `unit` is a random number in `0..1`
    /// (the jitter).
    pub fn fail(&mut self, backoff: &Backoff, unit: f64) -> Duration {
        self.index = (self.index + 1) % self.urls.len();
        self.fails_in_round += 1;
        if self.fails_in_round < self.urls.len() {
            return backoff.min.mul_f64(unit / 2.0);
        }
        self.fails_in_round = 0;
        let delay = backoff.delay_with(self.rounds, unit);
        self.rounds = self.rounds.saturating_add(1);
        delay
    }

    /// The node in use took the connection: the next failure starts a fresh round.
    pub fn succeeded(&mut self) {
        self.fails_in_round = 0;
        self.rounds = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(delay: Duration) -> u128 {
        delay.as_millis()
    }

    #[test]
    fn round_robin_waits_only_at_the_end_of_a_full_round_and_doubles_per_round() {
        let backoff = Backoff { min: Duration::from_millis(100), max: Duration::from_secs(1) };
        let mut nodes = NodeRotation::new(["a", "b", "c"].into());
        assert_eq!(nodes.current(), "a");
        let seen: Vec<(String, u128)> = (0..9)
            .map(|_| {
                let delay = nodes.fail(&backoff, 0.0);
                (nodes.current().to_owned(), ms(delay))
            })
            .collect();
        let expected = [("b", 0), ("c", 0), ("a", 100), ("b", 0), ("c", 0), ("a", 200), ("b", 0), ("c", 0), ("a", 400)];
        assert_eq!(seen, expected.map(|(url, delay)| (url.to_owned(), delay)));
        // Within a round the jitter stays below min / 2.
        assert!(ms(nodes.fail(&backoff, 0.999)) < 50);
        // A good connection starts afresh.
        nodes.succeeded();
        let delays: Vec<u128> = (0..3).map(|_| ms(nodes.fail(&backoff, 0.0))).collect();
        assert_eq!(delays, [0, 0, 100]);
    }

    #[test]
    fn one_url_is_the_old_backoff() {
        let backoff = Backoff { min: Duration::from_millis(250), max: Duration::from_secs(1) };
        let mut nodes = NodeRotation::new("http://x".into());
        let delays: Vec<u128> = (0..5).map(|_| ms(nodes.fail(&backoff, 0.0))).collect();
        assert_eq!(delays, [250, 500, 1000, 1000, 1000]);
        assert_eq!(nodes.current(), "http://x");
        nodes.succeeded();
        assert_eq!(ms(nodes.fail(&backoff, 0.0)), 250);
    }

    #[test]
    #[should_panic(expected = "at least one node URL")]
    fn no_url_is_refused() {
        NodeRotation::new(Vec::<String>::new().into());
    }
}
