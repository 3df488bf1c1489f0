//! Cluster mode (issue 16): many nodes on one replicated NATS JetStream log.

pub mod snapshot;
