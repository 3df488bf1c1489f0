//! Decoding what clients send (JSON) into the engine's types, checked against the
//! collection's schema and the server's limits. Everything here runs on network
//! threads, so the writer thread only ever sees typed, pre-checked requests.

mod literal;
mod messages;
mod position;
mod schema;
mod view;
mod write;

pub(crate) use literal::*;
pub use messages::*;
pub use position::*;
pub use schema::*;
pub use view::*;
pub use write::*;
