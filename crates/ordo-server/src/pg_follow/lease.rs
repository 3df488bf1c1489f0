//! Cluster mode's follower lease: one key per slot in the JetStream key-value
//! bucket [`LEASE_BUCKET`], its value the holder's node name. A node takes it
//! with `create` (only when absent) and keeps it with `update` at the revision
//! it last wrote (compare-and-set); the bucket's `max_age` ([`LEASE_TTL`])
//! removes a value no one renewed, so a dead holder's lease lapses. The
//! revision a node took the lease at is its *term*: the fencing token its
//! entries carry (`pg_follow::apply`), higher for every later lease.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use tokio::time::Instant;

/// The key-value bucket of the follower leases.
pub const LEASE_BUCKET: &str = "ordo_pg_lease";
/// How long a lease lasts unrenewed (the bucket's `max_age`): a dead
/// holder's lease lapses at most this long after its last renewal.
pub const LEASE_TTL: Duration = Duration::from_secs(10);
/// How often the holder renews, and how often the other nodes look for a
/// lease to take.
pub const LEASE_RENEW_EVERY: Duration = Duration::from_secs(3);
/// A holder whose last renewal was sent longer ago than `LEASE_TTL` less this
/// stops following at once: its lease may lapse any moment.
pub const LEASE_SAFETY_MARGIN: Duration = Duration::from_secs(2);

/// The bucket, created by the first node that needs it.
pub async fn open_bucket(js: &jetstream::Context, replicas: usize) -> Result<kv::Store, String> {
    if let Ok(store) = js.get_key_value(LEASE_BUCKET).await {
        return Ok(store);
    }
    let config = kv::Config {
        bucket: LEASE_BUCKET.to_owned(),
        history: 1,
        max_age: LEASE_TTL,
        num_replicas: replicas,
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    };
    match js.create_key_value(config).await {
        Ok(store) => Ok(store),
        // Another node created it meanwhile.
        Err(error) => js
            .get_key_value(LEASE_BUCKET)
            .await
            .map_err(|_| format!("cannot create the follower lease bucket `{LEASE_BUCKET}`: {error}")),
    }
}

/// A lease this node holds.
pub struct Lease {
    store: kv::Store,
    key: String,
    node: String,
    revision: u64,
    /// The revision the lease was taken at.
    pub term: u64,
    /// When the last renewal that succeeded was sent.
    renewed_at: Instant,
}

/// What a node found when it looked for the lease.
pub enum Attempt {
    Taken(Box<Lease>),
    /// Another node holds it (its name, if it could be read).
    HeldBy(Option<String>),
}

/// Takes the lease of `key` for `node` if no one holds it.
pub async fn try_acquire(store: &kv::Store, key: &str, node: &str) -> Result<Attempt, String> {
    let sent_at = Instant::now();
    match store.create(key, node.to_owned().into_bytes().into()).await {
        Ok(revision) => Ok(Attempt::Taken(Box::new(Lease {
            store: store.clone(),
            key: key.to_owned(),
            node: node.to_owned(),
            revision,
            term: revision,
            renewed_at: sent_at,
        }))),
        Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {
            Ok(Attempt::HeldBy(holder(store, key).await))
        }
        Err(error) => Err(format!("cannot take the follower lease: {error}")),
    }
}

/// The node that holds `key`'s lease, if any.
pub async fn holder(store: &kv::Store, key: &str) -> Option<String> {
    let entry = store.entry(key).await.ok()??;
    (entry.operation == kv::Operation::Put).then(|| String::from_utf8_lossy(&entry.value).into_owned())
}

impl Lease {
    /// The time by which the next renewal must have succeeded.
    pub fn deadline(&self) -> Instant {
        self.renewed_at + LEASE_TTL - LEASE_SAFETY_MARGIN
    }

    /// Renews the lease (compare-and-set on the revision last written); an
    /// error, or no answer by the deadline, means it may be another's now.
    pub async fn renew(&mut self) -> Result<(), String> {
        let sent_at = Instant::now();
        let update = self.store.update(&self.key, self.node.clone().into_bytes().into(), self.revision);
        match tokio::time::timeout_at(self.deadline(), update).await {
            Ok(Ok(revision)) => {
                self.revision = revision;
                self.renewed_at = sent_at;
                Ok(())
            }
            Ok(Err(error)) => Err(format!("the follower lease could not be renewed: {error}")),
            Err(_) => Err("the follower lease could not be renewed before it could lapse".to_owned()),
        }
    }

    /// Gives the lease up (only if it is still this one), so another node
    /// takes over without waiting for it to lapse.
    pub async fn release(self) {
        let delete = self.store.delete_expect_revision(&self.key, Some(self.revision));
        let _ = tokio::time::timeout(LEASE_RENEW_EVERY, delete).await;
    }
}
