//! The decoder of `pgoutput`'s logical replication messages (protocol version
//! 1), as PostgreSQL sends them inside the `XLogData` frames of a replication
//! stream: Begin, Commit, Origin, Relation, Type, Insert, Update, Delete,
//! Truncate and (skipped) logical decoding messages. Every length is checked
//! against the bytes that are there: a short or malformed message is an error,
//! never a panic.

use crate::lsn::Lsn;

/// The most columns a PostgreSQL table can have (`MaxTupleAttributeNumber`).
pub const MAX_COLUMNS: usize = 1664;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
pub const POSTGRES_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// One column of a tuple as pgoutput sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cell {
    Null,
    /// A TOASTed value the update did not change: pgoutput leaves it out, and the
    /// follower keeps the value it has.
    UnchangedToast,
    /// The value's text form (pgoutput sends text unless binary was asked for).
    Text(String),
}

/// A column of a relation, as its Relation message describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelationColumn {
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
    /// Part of the replica identity (the primary key under `REPLICA IDENTITY DEFAULT`).
    pub is_key: bool,
}

/// A table's description, sent before the first change of it in a session and
/// again after its schema changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    pub oid: u32,
    pub schema: String,
    pub name: String,
    /// `d` default (primary key), `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    pub columns: Vec<RelationColumn>,
}

/// A decoded pgoutput message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Begin {
        final_lsn: Lsn,
        commit_time_unix_micros: i64,
        xid: u32,
    },
    Commit {
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time_unix_micros: i64,
    },
    Origin {
        origin_lsn: Lsn,
        name: String,
    },
    Relation(Relation),
    Type {
        oid: u32,
        schema: String,
        name: String,
    },
    Insert {
        relation_oid: u32,
        new: Vec<Cell>,
    },
    /// `old` is the old key (`K`, when the key changed) or the whole old row
    /// (`O`, under `REPLICA IDENTITY FULL`); absent when the key did not change.
    Update {
        relation_oid: u32,
        old: Option<Vec<Cell>>,
        new: Vec<Cell>,
    },
    /// `old` holds the key columns (the others null) or the whole old row.
    Delete {
        relation_oid: u32,
        old: Vec<Cell>,
    },
    Truncate {
        relation_oids: Vec<u32>,
        cascade: bool,
        restart_identity: bool,
    },
    /// A `pg_logical_emit_message` message: not followed.
    LogicalMessage,
}

/// A message that does not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed pgoutput message: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one pgoutput message (the payload of an `XLogData` frame).
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let mut reader = Reader { bytes, at: 0 };
    let tag = reader.u8()?;
    let message = match tag {
        b'B' => Message::Begin {
            final_lsn: Lsn(reader.u64()?),
            commit_time_unix_micros: reader.timestamp()?,
            xid: reader.u32()?,
        },
        b'C' => {
            let _flags = reader.u8()?;
            Message::Commit {
                commit_lsn: Lsn(reader.u64()?),
                end_lsn: Lsn(reader.u64()?),
                commit_time_unix_micros: reader.timestamp()?,
            }
        }
        b'O' => Message::Origin { origin_lsn: Lsn(reader.u64()?), name: reader.cstr()? },
        b'R' => Message::Relation(decode_relation(&mut reader)?),
        b'Y' => Message::Type { oid: reader.u32()?, schema: reader.cstr()?, name: reader.cstr()? },
        b'I' => {
            let relation_oid = reader.u32()?;
            reader.expect(b'N')?;
            Message::Insert { relation_oid, new: reader.tuple()? }
        }
        b'U' => decode_update(&mut reader)?,
        b'D' => {
            let relation_oid = reader.u32()?;
            match reader.u8()? {
                b'K' | b'O' => Message::Delete { relation_oid, old: reader.tuple()? },
                other => return Err(DecodeError(format!("delete with tuple tag {other:#x}"))),
            }
        }
        b'T' => decode_truncate(&mut reader)?,
        b'M' => return Ok(Message::LogicalMessage),
        other => return Err(DecodeError(format!("unknown message tag {other:#x}"))),
    };
    reader.finish()?;
    Ok(message)
}

fn decode_relation(reader: &mut Reader<'_>) -> Result<Relation, DecodeError> {
    let oid = reader.u32()?;
    let schema = reader.cstr()?;
    let name = reader.cstr()?;
    let replica_identity = reader.u8()?;
    let n_columns = reader.column_count()?;
    let mut columns = Vec::with_capacity(n_columns);
    for _ in 0..n_columns {
        let flags = reader.u8()?;
        columns.push(RelationColumn {
            name: reader.cstr()?,
            type_oid: reader.u32()?,
            type_modifier: reader.u32()? as i32,
            is_key: flags & 1 == 1,
        });
    }
    Ok(Relation { oid, schema, name, replica_identity, columns })
}

fn decode_update(reader: &mut Reader<'_>) -> Result<Message, DecodeError> {
    let relation_oid = reader.u32()?;
    let (old, new_tag) = match reader.u8()? {
        b'K' | b'O' => {
            let old = reader.tuple()?;
            (Some(old), reader.u8()?)
        }
        tag => (None, tag),
    };
    if new_tag != b'N' {
        return Err(DecodeError(format!("update with tuple tag {new_tag:#x} where `N` belongs")));
    }
    Ok(Message::Update { relation_oid, old, new: reader.tuple()? })
}

fn decode_truncate(reader: &mut Reader<'_>) -> Result<Message, DecodeError> {
    let n_relations = reader.u32()? as usize;
    let options = reader.u8()?;
    // Four bytes an oid: a count the message cannot hold is refused before allocating.
    if n_relations > reader.remaining() / 4 {
        return Err(DecodeError(format!("truncate of {n_relations} relations in {} bytes", reader.remaining())));
    }
    let relation_oids = (0..n_relations).map(|_| reader.u32()).collect::<Result<_, _>>()?;
    Ok(Message::Truncate { relation_oids, cascade: options & 1 == 1, restart_identity: options & 2 == 2 })
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.bytes.len());
        let end = end.ok_or_else(|| DecodeError(format!("{n} bytes wanted at offset {}, message ends", self.at)))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A PostgreSQL timestamp (µs since 2000-01-01) as µs since the Unix epoch.
    fn timestamp(&mut self) -> Result<i64, DecodeError> {
        (self.u64()? as i64)
            .checked_add(POSTGRES_EPOCH_UNIX_MICROS)
            .ok_or_else(|| DecodeError("timestamp beyond the Unix-epoch range".into()))
    }

    fn expect(&mut self, tag: u8) -> Result<(), DecodeError> {
        match self.u8()? {
            found if found == tag => Ok(()),
            found => Err(DecodeError(format!("tag {found:#x} where {:?} belongs", tag as char))),
        }
    }

    fn cstr(&mut self) -> Result<String, DecodeError> {
        let rest = &self.bytes[self.at..];
        let len = rest.iter().position(|byte| *byte == 0).ok_or_else(|| DecodeError("unterminated string".into()))?;
        let text = self.take(len)?;
        self.at += 1;
        String::from_utf8(text.to_vec()).map_err(|_| DecodeError("a name is not UTF-8".into()))
    }

    fn column_count(&mut self) -> Result<usize, DecodeError> {
        let n = usize::from(self.u16()?);
        if n > MAX_COLUMNS {
            return Err(DecodeError(format!("{n} columns, more than PostgreSQL's {MAX_COLUMNS}")));
        }
        Ok(n)
    }

    fn tuple(&mut self) -> Result<Vec<Cell>, DecodeError> {
        let n_columns = self.column_count()?;
        let mut cells = Vec::with_capacity(n_columns);
        for _ in 0..n_columns {
            cells.push(match self.u8()? {
                b'n' => Cell::Null,
                b'u' => Cell::UnchangedToast,
                b't' => {
                    let len = self.u32()? as usize;
                    let text = self.take(len)?;
                    Cell::Text(
                        String::from_utf8(text.to_vec()).map_err(|_| DecodeError("a value is not UTF-8".into()))?,
                    )
                }
                b'b' => return Err(DecodeError("a binary value (this follower asks for text)".into())),
                other => return Err(DecodeError(format!("unknown column kind {other:#x}"))),
            });
        }
        Ok(cells)
    }

    fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError(format!("{extra} bytes after the message"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes messages the way pgoutput does, for the decoder's tests.
    #[derive(Default)]
    struct Encoder(Vec<u8>);

    impl Encoder {
        fn u8(mut self, value: u8) -> Self {
            self.0.push(value);
            self
        }
        fn u16(mut self, value: u16) -> Self {
            self.0.extend_from_slice(&value.to_be_bytes());
            self
        }
        fn u32(mut self, value: u32) -> Self {
            self.0.extend_from_slice(&value.to_be_bytes());
            self
        }
        fn u64(mut self, value: u64) -> Self {
            self.0.extend_from_slice(&value.to_be_bytes());
            self
        }
        fn cstr(mut self, text: &str) -> Self {
            self.0.extend_from_slice(text.as_bytes());
            self.0.push(0);
            self
        }
        fn tuple(self, cells: &[Cell]) -> Self {
            let mut encoder = self.u16(cells.len() as u16);
            for cell in cells {
                encoder = match cell {
                    Cell::Null => encoder.u8(b'n'),
                    Cell::UnchangedToast => encoder.u8(b'u'),
                    Cell::Text(text) => {
                        let mut encoder = encoder.u8(b't').u32(text.len() as u32);
                        encoder.0.extend_from_slice(text.as_bytes());
                        encoder
                    }
                };
            }
            encoder
        }
    }

    fn text(value: &str) -> Cell {
        Cell::Text(value.into())
    }

    #[test]
    fn begin_and_commit_carry_their_positions_and_unix_times() {
        let begin = Encoder::default().u8(b'B').u64(0x1_0000_0010).u64(1_000_000).u32(77).0;
        assert_eq!(
            decode(&begin),
            Ok(Message::Begin {
                final_lsn: Lsn(0x1_0000_0010),
                commit_time_unix_micros: POSTGRES_EPOCH_UNIX_MICROS + 1_000_000,
                xid: 77
            })
        );
        let commit = Encoder::default().u8(b'C').u8(0).u64(10).u64(20).u64(0).0;
        assert_eq!(
            decode(&commit),
            Ok(Message::Commit {
                commit_lsn: Lsn(10),
                end_lsn: Lsn(20),
                commit_time_unix_micros: POSTGRES_EPOCH_UNIX_MICROS
            })
        );
    }

    #[test]
    fn a_relation_lists_its_columns_and_key() {
        let bytes = Encoder::default()
            .u8(b'R')
            .u32(16384)
            .cstr("public")
            .cstr("rooms")
            .u8(b'd')
            .u16(2)
            .u8(1)
            .cstr("id")
            .u32(23)
            .u32(u32::MAX)
            .u8(0)
            .cstr("name")
            .u32(25)
            .u32(u32::MAX)
            .0;
        let Ok(Message::Relation(relation)) = decode(&bytes) else { panic!("{:?}", decode(&bytes)) };
        assert_eq!((relation.oid, relation.schema.as_str(), relation.name.as_str()), (16384, "public", "rooms"));
        assert_eq!(relation.columns.len(), 2);
        assert!(relation.columns[0].is_key && !relation.columns[1].is_key);
        assert_eq!((relation.columns[1].name.as_str(), relation.columns[1].type_oid), ("name", 25));
        assert_eq!(relation.columns[0].type_modifier, -1);
    }

    #[test]
    fn inserts_updates_and_deletes_carry_their_tuples() {
        let insert = Encoder::default().u8(b'I').u32(5).u8(b'N').tuple(&[text("1"), Cell::Null]).0;
        assert_eq!(decode(&insert), Ok(Message::Insert { relation_oid: 5, new: vec![text("1"), Cell::Null] }));

        let update = Encoder::default().u8(b'U').u32(5).u8(b'N').tuple(&[text("1"), Cell::UnchangedToast]).0;
        assert_eq!(
            decode(&update),
            Ok(Message::Update { relation_oid: 5, old: None, new: vec![text("1"), Cell::UnchangedToast] })
        );

        let key_change = Encoder::default()
            .u8(b'U')
            .u32(5)
            .u8(b'K')
            .tuple(&[text("1"), Cell::Null])
            .u8(b'N')
            .tuple(&[text("2"), text("x")])
            .0;
        assert_eq!(
            decode(&key_change),
            Ok(Message::Update {
                relation_oid: 5,
                old: Some(vec![text("1"), Cell::Null]),
                new: vec![text("2"), text("x")]
            })
        );

        let delete = Encoder::default().u8(b'D').u32(5).u8(b'K').tuple(&[text("2"), Cell::Null]).0;
        assert_eq!(decode(&delete), Ok(Message::Delete { relation_oid: 5, old: vec![text("2"), Cell::Null] }));
    }

    #[test]
    fn a_truncate_names_every_relation_and_its_options() {
        let bytes = Encoder::default().u8(b'T').u32(2).u8(3).u32(7).u32(8).0;
        assert_eq!(
            decode(&bytes),
            Ok(Message::Truncate { relation_oids: vec![7, 8], cascade: true, restart_identity: true })
        );
        let lying_count = Encoder::default().u8(b'T').u32(1 << 30).u8(0).u32(7).0;
        assert!(decode(&lying_count).is_err());
    }

    #[test]
    fn every_truncated_or_padded_message_is_an_error_not_a_panic() {
        let whole = Encoder::default().u8(b'U').u32(5).u8(b'K').tuple(&[text("1")]).u8(b'N').tuple(&[text("22")]).0;
        assert!(decode(&whole).is_ok());
        for len in 0..whole.len() {
            assert!(decode(&whole[..len]).is_err(), "a prefix of {len} bytes decoded");
        }
        let mut padded = whole.clone();
        padded.push(0);
        assert!(decode(&padded).is_err());
        let binary = Encoder::default().u8(b'I').u32(5).u8(b'N').u16(1).u8(b'b').u32(0).0;
        assert!(decode(&binary).is_err());
        let too_many_columns = Encoder::default().u8(b'I').u32(5).u8(b'N').u16(MAX_COLUMNS as u16 + 1).0;
        assert!(decode(&too_many_columns).unwrap_err().0.contains("columns"));
    }
}
