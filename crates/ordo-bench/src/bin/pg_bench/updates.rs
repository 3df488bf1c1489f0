//! The transactions the writers send: which rows, the SQL, and when.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use ordo_bench::live::stats::XorShift64;

/// The followed table and the collection Ordo serves it as.
pub const TABLE: &str = "rooms";

/// The latency phase numbers its updates from here up (in `last_seq`), so that
/// the counts the streaming phase left there (`last_seq + 1` per update, far
/// fewer than this) read as "never updated" to a subscriber, not as updates
/// with a send time.
pub const LATENCY_NUMBER_BASE: u64 = 1 << 40;

/// The id of row `number` (rows are numbered from 0).
pub fn room_id(number: u64) -> String {
    format!("r{number}")
}

/// An update's number for a subscriber (`UpdateMarks::number`): 0 for a row the
/// latency phase has not updated.
pub fn latency_update_number(last_seq: u64) -> u64 {
    last_seq.saturating_sub(LATENCY_NUMBER_BASE)
}

/// Picks the rows of one writer's transactions: distinct rows within a
/// transaction, all among this writer's own (those whose number is the writer's
/// index modulo the number of writers), so that concurrent transactions never
/// wait on each other's row locks.
pub struct RowPicker {
    rng: XorShift64,
    writer: u64,
    writers: u64,
    own_rows: u64,
    picked: BTreeSet<u64>,
}

impl RowPicker {
    /// Writer `writer` of `writers` over `rows` rows; it needs at least one
    /// transaction's worth of rows of its own (the options check it).
    pub fn new(seed: u64, writer: usize, writers: usize, rows: u64) -> RowPicker {
        let (writer, writers) = (writer as u64, writers as u64);
        RowPicker {
            rng: XorShift64::new(seed.wrapping_add(writer)),
            writer,
            writers,
            own_rows: (rows - writer).div_ceil(writers),
            picked: BTreeSet::new(),
        }
    }

    /// `n` distinct row numbers of this writer, ascending.
    pub fn pick(&mut self, n: usize) -> Vec<u64> {
        assert!(n as u64 <= self.own_rows, "{n} rows asked of a writer holding {}", self.own_rows);
        self.picked.clear();
        while self.picked.len() < n {
            let own = self.rng.below(self.own_rows);
            self.picked.insert(self.writer + own * self.writers);
        }
        self.picked.iter().copied().collect()
    }
}

/// The streaming phase's transaction: every row gets the send time as its
/// recency and one more `last_seq`.
pub fn streaming_update(rows: &[u64], sent_us: u64) -> String {
    let mut sql = format!("UPDATE {TABLE} SET recency = {sent_us}, last_seq = last_seq + 1 WHERE id IN (");
    for (index, &row) in rows.iter().enumerate() {
        let separator = if index == 0 { "" } else { "," };
        let _ = write!(sql, "{separator}'{}'", room_id(row));
    }
    sql.push(')');
    sql
}

/// The latency phase's transaction: every row gets the send time as its
/// recency and an update number of its own, the first `first_number`.
pub fn numbered_update(rows: &[u64], sent_us: u64, first_number: u64) -> String {
    let mut sql = format!("UPDATE {TABLE} SET recency = {sent_us}, last_seq = v.seq FROM (VALUES ");
    for (index, &row) in rows.iter().enumerate() {
        let separator = if index == 0 { "" } else { "," };
        let number = LATENCY_NUMBER_BASE + first_number + index as u64;
        let _ = write!(sql, "{separator}('{}', {number}::bigint)", room_id(row));
    }
    sql.push_str(") AS v(id, seq) WHERE rooms.id = v.id");
    sql
}

/// When transaction `index` (from 0) of a paced writer is due, counted from
/// the phase's start: a fixed schedule, so a late transaction is followed by
/// the ones due meanwhile at once and the rate holds over the phase.
pub fn due_after(index: u64, transactions_per_second: f64) -> Duration {
    Duration::from_secs_f64(index as f64 / transactions_per_second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_picks_distinct_rows_of_its_own() {
        let rows = 1_003;
        let mut picker = RowPicker::new(7, 2, 4, rows);
        for _ in 0..50 {
            let picked = picker.pick(100);
            assert_eq!(picked.len(), 100);
            assert!(picked.windows(2).all(|pair| pair[0] < pair[1]), "distinct and ascending");
            assert!(picked.iter().all(|&row| row % 4 == 2 && row < rows), "{picked:?}");
        }
        // A writer may take every row it holds: 1 003 rows over 4 writers leave 251 to writer 2.
        let all = RowPicker::new(1, 2, 4, rows).pick(251);
        assert_eq!(all, (0..251).map(|own| 2 + own * 4).collect::<Vec<_>>());
        assert_eq!(RowPicker::new(1, 3, 4, rows).own_rows, 250);
    }

    #[test]
    fn the_statements_name_every_row_once() {
        assert_eq!(
            streaming_update(&[3, 10], 42),
            "UPDATE rooms SET recency = 42, last_seq = last_seq + 1 WHERE id IN ('r3','r10')"
        );
        let base = LATENCY_NUMBER_BASE;
        assert_eq!(
            numbered_update(&[3, 10], 42, 5),
            format!(
                "UPDATE rooms SET recency = 42, last_seq = v.seq FROM (VALUES ('r3', {}::bigint),('r10', {}::bigint)) \
                 AS v(id, seq) WHERE rooms.id = v.id",
                base + 5,
                base + 6
            )
        );
    }

    #[test]
    fn streaming_counts_are_not_update_numbers() {
        assert_eq!(latency_update_number(0), 0);
        assert_eq!(latency_update_number(123_456), 0);
        assert_eq!(latency_update_number(LATENCY_NUMBER_BASE + 9), 9);
    }

    #[test]
    fn the_schedule_spreads_transactions_evenly() {
        assert_eq!(due_after(0, 50.0), Duration::ZERO);
        assert_eq!(due_after(1, 50.0), Duration::from_millis(20));
        assert_eq!(due_after(250, 50.0), Duration::from_secs(5));
        assert_eq!(due_after(3, 0.5), Duration::from_secs(6));
    }
}
