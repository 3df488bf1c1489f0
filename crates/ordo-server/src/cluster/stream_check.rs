//! An existing stream is checked before a node binds to it: the
//! first node creates the stream with its flags, and every later node (or an
//! operator with `nats stream add`) may meet one made otherwise. A difference
//! that breaks a guarantee of docs/SCALING.md refuses the start, naming it; a
//! harmless one is logged and the stream's own setting stands.

use std::time::Duration;

use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};

use super::{ClusterOptions, PUBLISH_RETRY_SPAN, SUBJECT};

/// What binding `options` to a stream configured as `config` means: the
/// warnings to log, or why the node must not start.
pub fn check(config: &Config, options: &ClusterOptions) -> Result<Vec<String>, String> {
    let name = &options.stream;
    let mut refusals = Vec::new();
    let mut warnings = Vec::new();
    if config.subjects != [SUBJECT] {
        // Other subjects' messages take seqs between Ordo's entries (seen as
        // gaps), or Ordo's entries would not be stored at all.
        refusals.push(format!("its subjects are {:?}, Ordo's stream takes exactly [\"{SUBJECT}\"]", config.subjects));
    }
    if config.retention != RetentionPolicy::Limits {
        // Interest and work-queue streams delete entries once consumed: a new
        // node would find nothing to replay.
        refusals.push(format!(
            "its retention policy is {:?}; Ordo needs `limits` (entries are kept for every node, new ones included)",
            config.retention
        ));
    }
    if config.storage != StorageType::File {
        refusals.push(
            "its storage is memory: acknowledged entries would not survive the NATS servers restarting".to_owned(),
        );
    }
    if config.num_replicas < options.replicas {
        refusals.push(format!(
            "it has {} replica(s) where this node asks for {} (--stream-replicas): an acknowledged entry would \
             survive fewer server failures than asked",
            config.num_replicas, options.replicas
        ));
    } else if config.num_replicas > options.replicas {
        warnings.push(format!(
            "stream `{name}` has {} replicas (this node asked for {}); keeping the stream's",
            config.num_replicas, options.replicas
        ));
    }
    if config.duplicate_window < PUBLISH_RETRY_SPAN {
        refusals.push(format!(
            "its duplicate window is {:?}, shorter than the {:?} over which a node sends a publish again: a retried \
             publish could be applied twice",
            config.duplicate_window, PUBLISH_RETRY_SPAN
        ));
    } else if config.duplicate_window != super::DUPLICATE_WINDOW {
        warnings.push(format!(
            "stream `{name}` has a duplicate window of {:?} (Ordo creates {:?}); keeping the stream's",
            config.duplicate_window,
            super::DUPLICATE_WINDOW
        ));
    }
    let max_msgs = if options.stream_max_msgs == 0 { -1 } else { options.stream_max_msgs as i64 };
    if config.max_messages != max_msgs || config.max_age != options.stream_max_age {
        warnings.push(format!(
            "stream `{name}` keeps {} and {} (this node's --stream-max-msgs / --stream-max-age ask for {} and {}); \
             the stream's retention stands: size it against --snapshot-every (docs/SCALING.md)",
            limit_text(config.max_messages, "entries"),
            age_text(config.max_age),
            limit_text(max_msgs, "entries"),
            age_text(options.stream_max_age),
        ));
    }
    if config.max_bytes > 0 || config.max_messages_per_subject > 0 {
        warnings.push(format!(
            "stream `{name}` also drops entries past {} or {} per subject: count them in the retention rule \
             (docs/SCALING.md)",
            limit_text(config.max_bytes, "bytes"),
            limit_text(config.max_messages_per_subject, "entries")
        ));
    }
    if config.discard == DiscardPolicy::New {
        warnings.push(format!(
            "stream `{name}` refuses new entries when full (discard new): writes fail with 503 until it has room"
        ));
    }
    if refusals.is_empty() {
        Ok(warnings)
    } else {
        Err(format!(
            "the stream `{name}` exists with a configuration Ordo cannot use: {}. Use another --stream, or delete \
             the stream (losing its entries) and let a node create it",
            refusals.join("; ")
        ))
    }
}

fn limit_text(limit: i64, unit: &str) -> String {
    if limit <= 0 {
        format!("unlimited {unit}")
    } else {
        format!("{limit} {unit}")
    }
}

fn age_text(age: Duration) -> String {
    if age.is_zero() {
        "no age limit".to_owned()
    } else {
        format!("entries up to {age:?} old")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> ClusterOptions {
        let listen = "127.0.0.1:7070".parse().unwrap();
        ClusterOptions::new("nats://127.0.0.1:4222", Some("n".into()), listen, "ORDO".into(), 3, 10).unwrap()
    }

    type Change = Box<dyn Fn(&mut Config)>;

    /// The configuration a node creates (`Cluster::connect`).
    fn created() -> Config {
        Config {
            name: "ORDO".into(),
            subjects: vec![SUBJECT.to_owned()],
            num_replicas: 3,
            storage: StorageType::File,
            duplicate_window: super::super::DUPLICATE_WINDOW,
            max_messages: -1,
            ..Default::default()
        }
    }

    #[test]
    fn the_stream_a_node_creates_passes_silently() {
        assert_eq!(check(&created(), &options()).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn mismatches_that_break_a_guarantee_refuse_and_say_which() {
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|c| c.subjects = vec!["ordo.>".into()]), "subjects"),
            (Box::new(|c| c.subjects.push("other".into())), "subjects"),
            (Box::new(|c| c.retention = RetentionPolicy::WorkQueue), "retention policy"),
            (Box::new(|c| c.retention = RetentionPolicy::Interest), "retention policy"),
            (Box::new(|c| c.storage = StorageType::Memory), "memory"),
            (Box::new(|c| c.num_replicas = 1), "1 replica(s) where this node asks for 3"),
            (Box::new(|c| c.duplicate_window = Duration::from_secs(5)), "duplicate window"),
            (Box::new(|c| c.duplicate_window = PUBLISH_RETRY_SPAN - Duration::from_millis(1)), "duplicate window"),
        ];
        for (change, what) in cases {
            let mut config = created();
            change(&mut config);
            let error = check(&config, &options()).unwrap_err();
            assert!(error.contains(what) && error.contains("`ORDO`"), "{what}: {error}");
        }
    }

    #[test]
    fn harmless_differences_warn_and_start() {
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|c| c.num_replicas = 5), "5 replicas"),
            (Box::new(|c| c.duplicate_window = PUBLISH_RETRY_SPAN), "duplicate window"),
            (Box::new(|c| c.max_messages = 1000), "keeps 1000 entries"),
            (Box::new(|c| c.max_age = Duration::from_secs(3600)), "3600s old"),
            (Box::new(|c| c.max_bytes = 1 << 30), "bytes"),
            (Box::new(|c| c.discard = DiscardPolicy::New), "discard new"),
        ];
        for (change, what) in cases {
            let mut config = created();
            change(&mut config);
            let warnings = check(&config, &options()).unwrap();
            assert_eq!(warnings.len(), 1, "{what}: {warnings:?}");
            assert!(warnings[0].contains(what), "{what}: {warnings:?}");
        }
    }
}
