//! PostgreSQL as the reference for what byte-ordered sorts on one table leave
//! untested: collated sorts (ICU4X in Ordo against libicu's collations in
//! PostgreSQL) and views that sort and filter by fields read through a
//! reference (a `LEFT JOIN` in PostgreSQL). After each random transaction,
//! once Ordo applied it, random windows equal PostgreSQL's answer to the same
//! query, both one-shot queries and live subscriptions kept by their diffs
//! since the copy: the id in byte order (`COLLATE "C"`) breaks ties in both directions
//! and nulls sort last in both, as Ordo orders them (docs/PROTOCOL.md, "Views
//! and windows").

mod common;

use std::fmt;

use common::postgres::{
    model_seed, postgres, postgres_json_rows, start_following, wait_applied, LiveWindows, OrdoWindow, PUBLICATION,
};
use common::Server;

use ordo_test_kit::postgres::PostgresServer;
use ordo_test_kit::rng::Rng;
use serde_json::{json, Value};

/// Random transactions per test, and random windows checked after each.
const N_TRANSACTIONS: u64 = 40;
const N_WINDOWS_PER_TRANSACTION: usize = 4;
/// Windows subscribed after the copy and checked after every transaction.
const N_LIVE_WINDOWS: usize = 4;

/// The locales of collated windows, as Ordo is given them.
const LOCALES: [&str; 7] = ["root", "und", "fr", "de", "sv", "es", "de-u-co-phonebk"];

/// What a collated string is made of: letters that tailorings move (Swedish
/// "å ä ö" after "z", "ø æ" as "ö ä"; German phonebook "ä ö ü" as "ae oe ue";
/// Spanish "ñ" after "n"), the letters they are compared with, both cases,
/// digits, a space, a hyphen, and two combining marks (an acute accent and a
/// cedilla), so that decomposed spellings of precomposed letters ("e" + U+0301
/// for "é") and marks out of canonical order meet.
const ALPHABET: [&str; 42] = [
    "a", "e", "o", "u", "n", "s", "c", "z", "y", "A", "E", "O", "U", "N", "S", "Z", "é", "è", "ê", "ë", "à", "ä", "ö",
    "ü", "å", "ø", "æ", "ß", "ç", "ñ", "É", "Ä", "Ö", "Å", "Ñ", "0", "1", "9", " ", "-", "\u{301}", "\u{327}",
];

/// The most rows a window holds (docs/PROTOCOL.md).
const MAX_WINDOW_ROWS: usize = 1000;

/// At most this many characters in a generated string.
const MAX_TEXT_CHARS: usize = 8;

/// A collated sort key: a locale, with or without `case_insensitive`.
#[derive(Clone, Copy, Debug)]
struct Collated {
    locale: &'static str,
    case_insensitive: bool,
}

impl Collated {
    fn random(rng: &mut Rng) -> Collated {
        Collated { locale: LOCALES[rng.below(LOCALES.len())], case_insensitive: rng.below(2) == 1 }
    }

    /// The PostgreSQL collation made for this one by [`create_postgres_collations`].
    fn postgres_name(self) -> String {
        format!("\"{}{}\"", self.locale, if self.case_insensitive { "/ci" } else { "" })
    }

    /// The ICU locale of the PostgreSQL collation. Ordo's `case_insensitive`
    /// is secondary strength (accents matter, case does not: `ks-level2`),
    /// its default tertiary (`ks-level3`, ICU's default too). `kk` turns on
    /// ICU's normalization, as Ordo compares canonically equivalent strings
    /// alike: without it libicu takes marks out of canonical order as they
    /// come: it sorts U+0301 U+0327 before U+0327 and apart from its
    /// canonical equivalent U+0327 U+0301, which Ordo (and libicu with `kk`)
    /// sorts after U+0327, as one string.
    fn postgres_locale(self) -> String {
        let tag = if self.locale == "root" { "und" } else { self.locale };
        let strength = if self.case_insensitive { "kk-ks-level2" } else { "kk-ks-level3" };
        if tag.contains("-u-") {
            format!("{tag}-{strength}")
        } else {
            format!("{tag}-u-{strength}")
        }
    }

    /// The key of an Ordo sort on `field`.
    fn ordo_sort_key(self, field: &str, descending: bool) -> Value {
        json!({"field": field, "dir": direction(descending), "collation": self.locale,
               "case_insensitive": self.case_insensitive})
    }
}

/// One ICU collation in PostgreSQL per locale and strength. Nondeterministic:
/// strings equal at the strength (only case apart, at secondary) are equal,
/// and the next `ORDER BY` key decides, as in Ordo (a deterministic collation
/// would order them by their bytes instead).
fn create_postgres_collations(pg: &PostgresServer) {
    let n_icu = pg.psql("SELECT count(*) FROM pg_collation WHERE collprovider = 'i'").unwrap();
    assert_ne!(n_icu, "0", "this PostgreSQL is built without ICU: no reference for collated sorts");
    let mut sql = String::new();
    for locale in LOCALES {
        for case_insensitive in [false, true] {
            let collated = Collated { locale, case_insensitive };
            sql.push_str(&format!(
                "CREATE COLLATION {} (provider = icu, locale = '{}', deterministic = false);\n",
                collated.postgres_name(),
                collated.postgres_locale()
            ));
        }
    }
    pg.psql(&sql).unwrap();
}

fn direction(descending: bool) -> &'static str {
    if descending {
        "desc"
    } else {
        "asc"
    }
}

/// `ORDER BY` words that place rows as Ordo does: nulls last in both directions.
fn postgres_direction(descending: bool) -> &'static str {
    if descending {
        "DESC NULLS LAST"
    } else {
        "ASC NULLS LAST"
    }
}

/// A random window of a model test: its query in Ordo and in PostgreSQL.
trait RandomWindow: fmt::Debug {
    fn random(rng: &mut Rng) -> Self;
    fn in_postgres(&self, pg: &PostgresServer) -> Vec<Value>;
    fn in_ordo(&self) -> OrdoWindow;
}

/// Checks random windows `W` after the copy of `copied`, then after each of
/// [`N_TRANSACTIONS`] transactions made by `transaction`, once Ordo applied it:
/// [`N_WINDOWS_PER_TRANSACTION`] new one-shot queries, and the
/// [`N_LIVE_WINDOWS`] subscribed after the copy.
fn windows_equal_postgres_after_each_transaction<W: RandomWindow>(
    pg: &PostgresServer,
    server: &Server,
    rng: &mut Rng,
    seed: u64,
    copied: &str,
    mut transaction: impl FnMut(&mut Rng) -> String,
) {
    let mut sql = copied.to_owned();
    let (mut n_windows_empty, mut n_rows) = (0, 0);
    let live: Vec<W> = (0..N_LIVE_WINDOWS).map(|_| W::random(rng)).collect();
    let mut subscribed = LiveWindows::subscribe(server, live.iter().map(W::in_ordo).collect());
    for n in 0..=N_TRANSACTIONS {
        if n > 0 {
            sql = transaction(rng);
            pg.psql(&sql).unwrap();
            wait_applied(server, n);
        }
        subscribed.settle();
        for (window, (_, rows)) in live.iter().zip(subscribed.rows()) {
            let context = format!("live {window:?} after {sql} (seed {seed})");
            assert_rows_equal(&rows, &window.in_postgres(pg), &context);
        }
        for _ in 0..N_WINDOWS_PER_TRANSACTION {
            let window = W::random(rng);
            let rows = window.in_postgres(pg);
            let context = format!("{window:?} after {sql} (seed {seed})");
            assert_rows_equal(&window.in_ordo().query_rows(server), &rows, &context);
            n_windows_empty += usize::from(rows.is_empty());
            n_rows += rows.len();
        }
    }
    // Windows that are mostly empty would prove little: say how full they were.
    let n_windows = (N_TRANSACTIONS + 1) as usize * N_WINDOWS_PER_TRANSACTION;
    let kind = std::any::type_name::<W>().rsplit("::").next().unwrap_or_default();
    println!("{kind}: {n_rows} rows compared in {n_windows} windows, {n_windows_empty} of them empty");
}

/// Fails naming the first row where Ordo's window and PostgreSQL's differ.
fn assert_rows_equal(ordo: &[Value], postgres: &[Value], context: &str) {
    if ordo == postgres {
        return;
    }
    let first = ordo.iter().zip(postgres).take_while(|(ordo, postgres)| ordo == postgres).count();
    panic!(
        "row {first} differs: Ordo has {:?}, PostgreSQL {:?} ({} and {} rows)\n\
         Ordo: {ordo:?}\nPostgreSQL: {postgres:?}\n{context}",
        ordo.get(first),
        postgres.get(first),
        ordo.len(),
        postgres.len()
    );
}

/// A random string of the collation alphabet: sometimes a variant of one
/// made before (its case changed here and there, so that strings equal at
/// secondary strength meet), sometimes NULL.
fn random_text(rng: &mut Rng, made: &mut Vec<String>) -> Option<String> {
    if rng.one_in(8) {
        return None;
    }
    let text: String = if !made.is_empty() && rng.one_in(3) {
        let original = rng.pick(made).clone();
        let mut variant = String::new();
        for c in original.chars() {
            if rng.below(2) == 1 {
                variant.extend(c.to_uppercase());
            } else {
                variant.extend(c.to_lowercase());
            }
        }
        // "ß" upper-cased is "SS": one character more.
        variant.chars().take(MAX_TEXT_CHARS).collect()
    } else {
        (0..rng.below(MAX_TEXT_CHARS + 1)).map(|_| *rng.pick(&ALPHABET)).collect()
    };
    if made.len() < 64 {
        made.push(text.clone());
    }
    Some(text)
}

/// A SQL literal of a text or NULL.
fn sql_text(text: &Option<String>) -> String {
    text.as_ref().map_or("NULL".to_owned(), |text| format!("'{}'", text.replace('\'', "''")))
}

/// The state of the collated test's generator: the ids the table holds, and
/// the strings made so far.
struct People {
    ids: Vec<String>,
    next_id: u64,
    texts: Vec<String>,
}

impl People {
    /// A new id: letters of both cases first, so that the byte order of ids
    /// (Ordo's tie-break) is not the order of insertion.
    fn insert(&mut self, rng: &mut Rng) -> String {
        self.next_id += 1;
        let id = format!("{}{}", rng.pick(&["a", "B", "c", "Z", "é"]), self.next_id);
        self.ids.push(id.clone());
        let name = random_text(rng, &mut self.texts);
        format!("INSERT INTO people VALUES ('{id}', {}, {});\n", sql_text(&name), rng.below(4))
    }

    /// One random statement on a row the table holds (an insert when it holds none).
    fn change(&mut self, rng: &mut Rng) -> String {
        if self.ids.is_empty() {
            return self.insert(rng);
        }
        let id = rng.pick(&self.ids).clone();
        match rng.below(5) {
            0 => {
                self.ids.retain(|held| *held != id);
                format!("DELETE FROM people WHERE id = '{id}';\n")
            }
            1 => format!(
                "UPDATE people SET name = {} WHERE id = '{id}';\n",
                sql_text(&random_text(rng, &mut self.texts))
            ),
            2 => format!("UPDATE people SET n = {} WHERE id = '{id}';\n", rng.below(4)),
            3 => format!(
                "UPDATE people SET name = {}, n = {} WHERE id = '{id}';\n",
                sql_text(&random_text(rng, &mut self.texts)),
                rng.below(4)
            ),
            _ => self.insert(rng),
        }
    }

    /// A transaction of 1..=4 random statements, now and then after a
    /// TRUNCATE and new rows, and an insert last so that every one reaches Ordo.
    fn transaction(&mut self, rng: &mut Rng) -> String {
        let mut sql = String::from("BEGIN;\n");
        if rng.one_in(15) {
            sql.push_str("TRUNCATE people;\n");
            self.ids.clear();
            // Rows again at once, so that the windows after it are not all empty.
            for _ in 0..10 {
                let insert = self.insert(rng);
                sql.push_str(&insert);
            }
        }
        for _ in 0..1 + rng.below(4) {
            let statement = self.change(rng);
            sql.push_str(&statement);
        }
        let last = self.insert(rng);
        sql.push_str(&last);
        sql.push_str("COMMIT;");
        sql
    }
}

/// A random window of `people` sorted by `name` collated, then maybe by `n`,
/// then by id; maybe filtered on `n`.
#[derive(Debug)]
struct CollatedWindow {
    collated: Collated,
    descending: bool,
    /// A second sort key on `n`, and its direction.
    then_by_n_descending: Option<bool>,
    min_n: Option<usize>,
    offset: usize,
    limit: usize,
}

impl RandomWindow for CollatedWindow {
    fn random(rng: &mut Rng) -> CollatedWindow {
        CollatedWindow {
            collated: Collated::random(rng),
            descending: rng.below(2) == 1,
            then_by_n_descending: rng.one_in(3).then(|| rng.below(2) == 1),
            min_n: rng.one_in(4).then(|| rng.below(4)),
            offset: rng.below(8),
            limit: 1 + rng.below(20),
        }
    }

    fn in_postgres(&self, pg: &PostgresServer) -> Vec<Value> {
        let filter = self.min_n.map_or(String::new(), |min| format!("WHERE n >= {min}"));
        let then_by_n = self
            .then_by_n_descending
            .map_or(String::new(), |descending| format!("n {}, ", postgres_direction(descending)));
        postgres_json_rows(
            pg,
            &format!(
                "SELECT json_build_object('id', id, 'name', name, 'n', n) FROM people {filter}
                 ORDER BY name COLLATE {} {}, {then_by_n}id COLLATE \"C\" LIMIT {} OFFSET {}",
                self.collated.postgres_name(),
                postgres_direction(self.descending),
                self.limit,
                self.offset
            ),
        )
    }

    fn in_ordo(&self) -> OrdoWindow {
        let mut sort = vec![self.collated.ordo_sort_key("name", self.descending)];
        if let Some(descending) = self.then_by_n_descending {
            sort.push(json!({"field": "n", "dir": direction(descending)}));
        }
        let mut query = json!({"sort": sort, "offset": self.offset, "limit": self.limit});
        if let Some(min) = self.min_n {
            query["filter"] = json!({"field": "n", "op": "ge", "value": min});
        }
        OrdoWindow { collection: "people", query, fields: &["name", "n"] }
    }
}

/// A PostgreSQL with the collations and the published table `people`.
fn postgres_with_people_table() -> PostgresServer {
    let pg = postgres();
    create_postgres_collations(&pg);
    pg.psql(&format!(
        "CREATE TABLE people (id text PRIMARY KEY, name text, n int8 NOT NULL);
         CREATE PUBLICATION {PUBLICATION} FOR TABLE people;"
    ))
    .unwrap();
    pg
}

/// Every string of one or two characters of the alphabet (1 806 of them)
/// sorts alike in Ordo and in PostgreSQL, by every collation, whole: ICU4X's
/// CLDR data and PostgreSQL's libicu agree on this alphabet, pair by pair.
#[test]
fn every_string_of_up_to_two_characters_of_the_alphabet_sorts_as_postgres_by_every_collation() {
    let pg = postgres_with_people_table();
    let singles = ALPHABET.iter().map(|c| c.to_string());
    let pairs = ALPHABET.iter().flat_map(|first| ALPHABET.iter().map(move |second| format!("{first}{second}")));
    let texts: Vec<String> = singles.chain(pairs).collect();
    // Ids in the reverse of the alphabet's order (upper case after lower),
    // so that strings equal but for case are not in id order at either strength.
    let values: Vec<String> = texts
        .iter()
        .enumerate()
        .map(|(n, text)| format!("('w{:04}', {}, 0)", texts.len() - n, sql_text(&Some(text.clone()))))
        .collect();
    pg.psql(&format!("INSERT INTO people VALUES {};", values.join(", "))).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The rows are copied before the server listens.
    let server = start_following(&pg, dir.path(), &["people"]);
    for locale in LOCALES {
        for case_insensitive in [false, true] {
            for offset in (0..texts.len()).step_by(MAX_WINDOW_ROWS) {
                let window = CollatedWindow {
                    collated: Collated { locale, case_insensitive },
                    descending: false,
                    then_by_n_descending: None,
                    min_n: None,
                    offset,
                    limit: MAX_WINDOW_ROWS,
                };
                let (ordo, postgres) = (window.in_ordo().query_rows(&server), window.in_postgres(&pg));
                assert_rows_equal(&ordo, &postgres, &format!("{window:?}"));
            }
        }
    }
}

/// Collated windows (a few locales, with and without `case_insensitive`,
/// both directions, a second key, a filter, an offset, a limit) equal
/// PostgreSQL's ICU collations through random inserts, updates of the sorted
/// string and of the other column, deletes and TRUNCATEs.
#[test]
fn collated_windows_equal_postgres_icu_collations_through_random_transactions() {
    let seed = model_seed();
    let mut rng = Rng::new(seed);
    let pg = postgres_with_people_table();
    let mut people = People { ids: Vec::new(), next_id: 0, texts: Vec::new() };
    let copied: String = (0..30).map(|_| people.insert(&mut rng)).collect();
    pg.psql(&copied).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start_following(&pg, dir.path(), &["people"]);
    windows_equal_postgres_after_each_transaction::<CollatedWindow>(&pg, &server, &mut rng, seed, &copied, |rng| {
        people.transaction(rng)
    });
}

/// The ids rooms may have; members point at any of them, present or not.
const ROOM_IDS: [&str; 10] = ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"];

/// `members.room` reads `rooms` (no foreign key: a room can go while members
/// still point at it, and their fields through it read null).
const CHAT_TABLES: [&str; 2] = ["members:::ref.room=rooms", "rooms"];

/// The members' owners.
const OWNERS: [&str; 2] = ["alice", "bob"];

/// The fields the reference windows show: the member's own and the room's through `room`.
const MEMBER_FIELDS: [&str; 5] = ["owner", "room", "read_upto", "room.last_seq", "room.name"];

/// The state of the reference test's generator: the rooms and members the tables hold.
struct Chat {
    rooms: Vec<String>,
    members: Vec<String>,
    next_member: u64,
    texts: Vec<String>,
}

impl Chat {
    /// A room id, of a room that exists or not, or NULL.
    fn random_room_ref(rng: &mut Rng) -> String {
        if rng.one_in(10) {
            "NULL".to_owned()
        } else {
            format!("'{}'", rng.pick(&ROOM_IDS))
        }
    }

    /// A `last_seq`: small, so that members tie on it; sometimes NULL.
    fn random_seq(rng: &mut Rng) -> String {
        if rng.one_in(8) {
            "NULL".to_owned()
        } else {
            rng.below(8).to_string()
        }
    }

    fn insert_member(&mut self, rng: &mut Rng) -> String {
        self.next_member += 1;
        let id = format!("{}{}", rng.pick(&["m", "M", "n"]), self.next_member);
        self.members.push(id.clone());
        format!(
            "INSERT INTO members VALUES ('{id}', '{}', {}, {});\n",
            rng.pick(&OWNERS),
            Chat::random_room_ref(rng),
            rng.below(8)
        )
    }

    /// A room created with an id no room has (an update when every id is taken).
    fn insert_room(&mut self, rng: &mut Rng) -> String {
        let absent: Vec<&str> = ROOM_IDS.into_iter().filter(|id| !self.rooms.iter().any(|room| room == id)).collect();
        if absent.is_empty() {
            return self.change_room(rng);
        }
        let id = rng.pick(&absent).to_string();
        self.rooms.push(id.clone());
        let name = sql_text(&random_text(rng, &mut self.texts));
        format!("INSERT INTO rooms VALUES ('{id}', {name}, {});\n", Chat::random_seq(rng))
    }

    /// A room's `last_seq` or name changed, or the room deleted (a room created when there is none).
    fn change_room(&mut self, rng: &mut Rng) -> String {
        if self.rooms.is_empty() {
            return self.insert_room(rng);
        }
        let id = rng.pick(&self.rooms).clone();
        match rng.below(4) {
            0 => format!("UPDATE rooms SET last_seq = last_seq + {} WHERE id = '{id}';\n", 1 + rng.below(3)),
            1 => format!("UPDATE rooms SET last_seq = {} WHERE id = '{id}';\n", Chat::random_seq(rng)),
            2 => {
                format!("UPDATE rooms SET name = {} WHERE id = '{id}';\n", sql_text(&random_text(rng, &mut self.texts)))
            }
            _ => {
                self.rooms.retain(|held| *held != id);
                format!("DELETE FROM rooms WHERE id = '{id}';\n")
            }
        }
    }

    /// A member re-pointed, its `read_upto` changed, or the member deleted
    /// (a member added when there is none).
    fn change_member(&mut self, rng: &mut Rng) -> String {
        if self.members.is_empty() {
            return self.insert_member(rng);
        }
        let id = rng.pick(&self.members).clone();
        match rng.below(3) {
            0 => format!("UPDATE members SET room = {} WHERE id = '{id}';\n", Chat::random_room_ref(rng)),
            1 => format!("UPDATE members SET read_upto = {} WHERE id = '{id}';\n", rng.below(8)),
            _ => {
                self.members.retain(|held| *held != id);
                format!("DELETE FROM members WHERE id = '{id}';\n")
            }
        }
    }

    /// A transaction of 1..=5 random statements over both tables, now and
    /// then after a TRUNCATE of the rooms, and a member added last so that
    /// every one reaches Ordo.
    fn transaction(&mut self, rng: &mut Rng) -> String {
        let mut sql = String::from("BEGIN;\n");
        if rng.one_in(20) {
            sql.push_str("TRUNCATE rooms;\n");
            self.rooms.clear();
        }
        for _ in 0..1 + rng.below(5) {
            let statement = match rng.below(5) {
                0 | 1 => self.change_room(rng),
                2 => self.insert_room(rng),
                3 => self.change_member(rng),
                _ => self.insert_member(rng),
            };
            sql.push_str(&statement);
        }
        let last = self.insert_member(rng);
        sql.push_str(&last);
        sql.push_str("COMMIT;");
        sql
    }
}

/// The first sort key of a reference window: a field of the member's room.
#[derive(Clone, Copy, Debug)]
enum RoomKey {
    LastSeq,
    /// The room's name by bytes.
    Name,
    NameCollated(Collated),
}

/// Which members a reference window keeps.
#[derive(Clone, Copy, Debug)]
enum MemberFilter {
    Everyone,
    Owner(&'static str),
    LastSeqAtLeast(usize),
    /// The room has messages past the member's `read_upto` (a field-to-field comparison).
    Unread,
    /// `not` of the above: true where the comparison reads a null.
    NotUnread,
    RoomNameIsNull(bool),
}

impl MemberFilter {
    fn random(rng: &mut Rng) -> MemberFilter {
        match rng.below(7) {
            0 => MemberFilter::Owner(OWNERS[rng.below(OWNERS.len())]),
            1 => MemberFilter::LastSeqAtLeast(rng.below(8)),
            2 => MemberFilter::Unread,
            3 => MemberFilter::NotUnread,
            4 => MemberFilter::RoomNameIsNull(rng.below(2) == 1),
            _ => MemberFilter::Everyone,
        }
    }

    fn in_ordo(self) -> Value {
        let unread = json!({"field": "room.last_seq", "op": "gt", "value": {"field": "read_upto"}});
        match self {
            MemberFilter::Everyone => Value::Null,
            MemberFilter::Owner(owner) => json!({"field": "owner", "op": "eq", "value": owner}),
            MemberFilter::LastSeqAtLeast(min) => json!({"field": "room.last_seq", "op": "ge", "value": min}),
            MemberFilter::Unread => unread,
            MemberFilter::NotUnread => json!({"not": unread}),
            MemberFilter::RoomNameIsNull(is_null) => json!({"field": "room.name", "is_null": is_null}),
        }
    }

    /// The `WHERE` clause. A comparison with a null is false in Ordo, so `not`
    /// of it is true: SQL's three-valued `NOT` is made two-valued with `coalesce`.
    fn in_postgres(self) -> String {
        let condition = match self {
            MemberFilter::Everyone => "true".to_owned(),
            MemberFilter::Owner(owner) => format!("m.owner = '{owner}'"),
            MemberFilter::LastSeqAtLeast(min) => format!("r.last_seq >= {min}"),
            MemberFilter::Unread => "coalesce(r.last_seq > m.read_upto, false)".to_owned(),
            MemberFilter::NotUnread => "NOT coalesce(r.last_seq > m.read_upto, false)".to_owned(),
            MemberFilter::RoomNameIsNull(true) => "r.name IS NULL".to_owned(),
            MemberFilter::RoomNameIsNull(false) => "r.name IS NOT NULL".to_owned(),
        };
        format!("WHERE {condition}")
    }
}

/// A random window of `members` sorted by a field of their room, then maybe
/// by their own `read_upto`, then by id.
#[derive(Debug)]
struct ReferenceWindow {
    key: RoomKey,
    descending: bool,
    then_by_read_upto_descending: Option<bool>,
    filter: MemberFilter,
    offset: usize,
    limit: usize,
}

impl RandomWindow for ReferenceWindow {
    fn random(rng: &mut Rng) -> ReferenceWindow {
        let key = match rng.below(3) {
            0 => RoomKey::LastSeq,
            1 => RoomKey::Name,
            _ => RoomKey::NameCollated(Collated::random(rng)),
        };
        ReferenceWindow {
            key,
            descending: rng.below(2) == 1,
            then_by_read_upto_descending: rng.one_in(2).then(|| rng.below(2) == 1),
            filter: MemberFilter::random(rng),
            offset: rng.below(8),
            limit: 1 + rng.below(20),
        }
    }

    /// PostgreSQL's answer: the members joined to their rooms (a missing room
    /// gives nulls), in Ordo's order.
    fn in_postgres(&self, pg: &PostgresServer) -> Vec<Value> {
        let key = match self.key {
            RoomKey::LastSeq => "r.last_seq".to_owned(),
            RoomKey::Name => "r.name COLLATE \"C\"".to_owned(),
            RoomKey::NameCollated(collated) => format!("r.name COLLATE {}", collated.postgres_name()),
        };
        let then_by_read_upto = self
            .then_by_read_upto_descending
            .map_or(String::new(), |descending| format!("m.read_upto {}, ", postgres_direction(descending)));
        postgres_json_rows(
            pg,
            &format!(
                "SELECT json_build_object('id', m.id, 'owner', m.owner, 'room', m.room, 'read_upto', m.read_upto,
                   'room.last_seq', r.last_seq, 'room.name', r.name)
                 FROM members m LEFT JOIN rooms r ON r.id = m.room {}
                 ORDER BY {key} {}, {then_by_read_upto}m.id COLLATE \"C\" LIMIT {} OFFSET {}",
                self.filter.in_postgres(),
                postgres_direction(self.descending),
                self.limit,
                self.offset
            ),
        )
    }

    fn in_ordo(&self) -> OrdoWindow {
        let mut sort = vec![match self.key {
            RoomKey::LastSeq => json!({"field": "room.last_seq", "dir": direction(self.descending)}),
            RoomKey::Name => json!({"field": "room.name", "dir": direction(self.descending)}),
            RoomKey::NameCollated(collated) => collated.ordo_sort_key("room.name", self.descending),
        }];
        if let Some(descending) = self.then_by_read_upto_descending {
            sort.push(json!({"field": "read_upto", "dir": direction(descending)}));
        }
        let query = json!({"sort": sort, "filter": self.filter.in_ordo(), "fields": MEMBER_FIELDS,
                           "offset": self.offset, "limit": self.limit});
        OrdoWindow { collection: "members", query, fields: &MEMBER_FIELDS }
    }
}

/// Windows of members sorted and filtered by their room's fields (read
/// through the `room` reference) equal PostgreSQL's `LEFT JOIN` through
/// random transactions over both tables: rooms' `last_seq` and names changed
/// (moving their members), members re-pointed, rooms deleted and created
/// again while members point at them, and TRUNCATEs of the rooms.
#[test]
fn reference_windows_equal_a_postgres_left_join_through_random_transactions_on_both_tables() {
    let seed = model_seed();
    let mut rng = Rng::new(seed);
    let pg = postgres();
    create_postgres_collations(&pg);
    pg.psql(&format!(
        "CREATE TABLE rooms (id text PRIMARY KEY, name text, last_seq int8);
         CREATE TABLE members (id text PRIMARY KEY, owner text NOT NULL, room text, read_upto int8 NOT NULL);
         CREATE PUBLICATION {PUBLICATION} FOR TABLE rooms, members;"
    ))
    .unwrap();
    let mut chat = Chat { rooms: Vec::new(), members: Vec::new(), next_member: 0, texts: Vec::new() };
    let mut copied = String::new();
    for _ in 0..6 {
        copied.push_str(&chat.insert_room(&mut rng));
    }
    for _ in 0..20 {
        copied.push_str(&chat.insert_member(&mut rng));
    }
    pg.psql(&copied).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start_following(&pg, dir.path(), &CHAT_TABLES);
    windows_equal_postgres_after_each_transaction::<ReferenceWindow>(&pg, &server, &mut rng, seed, &copied, |rng| {
        chat.transaction(rng)
    });
}
