//! `ordo serve`'s PostgreSQL options (`--pg-*`, `ORDO_PG_*`, the TOML file's
//! `pg-*` keys and `[[postgres.table]]`), checked into [`PostgresOptions`].

use std::path::PathBuf;
use std::time::Duration;

use ordo_core::limits::MAX_COLLECTION_NAME_BYTES;
use ordo_pgsource::{ConnectConfig, Host, TableName, Tls, UnsupportedColumns};

use super::refs::{self, RefColumn};
use crate::cli::ServeArgs;
use crate::routing::is_reserved_name;

/// Most followed tables: one transaction's batches (one per table, and the
/// position) must fit in one group commit (`ordo_store::MAX_BATCHES_PER_COMMIT`).
pub const MAX_FOLLOWED_TABLES: usize = 64;

/// A followed table and the collection that serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableMapping {
    pub table: TableName,
    pub collection: String,
    /// The columns that become fields besides the key columns; `None`: all.
    pub columns: Option<Vec<String>>,
    /// Columns that hold ids of another followed table's rows (`ref` fields,
    /// always followed), and the column that is the payload (never a field).
    pub refs: Vec<RefColumn>,
    pub payload: Option<String>,
}

#[derive(Clone, Debug)]
pub struct PostgresOptions {
    pub connect: ConnectConfig,
    pub publication: String,
    /// Whether a first start creates the publication when it does not exist.
    pub create_publication: bool,
    pub slot: String,
    pub tables: Vec<TableMapping>,
    /// What a column of a type Ordo does not follow makes the follower do.
    pub unsupported_columns: UnsupportedColumns,
    /// The first and the longest wait between reconnection attempts.
    pub backoff_first: Duration,
    pub backoff_max: Duration,
}

/// The options from the parsed arguments; `None` without `--pg-table`.
pub fn from_args(args: &ServeArgs) -> Result<Option<PostgresOptions>, String> {
    if args.pg_table.is_empty() {
        return Ok(None);
    }
    if args.pg_table.len() > MAX_FOLLOWED_TABLES {
        return Err(format!("--pg-table: at most {MAX_FOLLOWED_TABLES} tables"));
    }
    let mut tables: Vec<TableMapping> = Vec::with_capacity(args.pg_table.len());
    for spec in &args.pg_table {
        let mapping = parse_table(spec)?;
        if tables.iter().any(|other| other.collection == mapping.collection || other.table == mapping.table) {
            return Err(format!("--pg-table `{spec}`: that table or collection is followed twice"));
        }
        tables.push(mapping);
    }
    for (name, option) in [(&args.pg_slot, "--pg-slot"), (&args.pg_publication, "--pg-publication")] {
        if name.is_empty() || name.len() > 63 {
            return Err(format!("{option} is 1..=63 bytes (a PostgreSQL name)"));
        }
    }
    let host = if args.pg_host.starts_with('/') {
        Host::UnixSocketDir(PathBuf::from(&args.pg_host))
    } else {
        Host::Tcp(args.pg_host.clone())
    };
    let connect = ConnectConfig {
        port: args.pg_port,
        user: args.pg_user.clone(),
        password: read_password(args.pg_password_file.as_ref())?,
        database: args.pg_database.clone(),
        application_name: "ordo".to_owned(),
        tls: tls_of(args, &host)?,
        host,
    };
    Ok(Some(PostgresOptions {
        connect,
        publication: args.pg_publication.clone(),
        create_publication: args.pg_create_publication,
        slot: args.pg_slot.clone(),
        tables,
        unsupported_columns: match args.pg_unsupported_columns.as_str() {
            "skip" => UnsupportedColumns::Skip,
            _ => UnsupportedColumns::Refuse,
        },
        backoff_first: Duration::from_millis(100),
        backoff_max: Duration::from_secs(10),
    }))
}

/// `TABLE`, `TABLE:COLLECTION`, `TABLE:COLLECTION:COL,COL` or
/// `TABLE:COLLECTION:COLUMNS:EXTRAS` (an empty collection part keeps the
/// table's name, an empty columns part follows every column; EXTRAS: see
/// [`refs::parse_extras`]).
pub fn parse_table(spec: &str) -> Result<TableMapping, String> {
    let mut parts = spec.splitn(4, ':');
    let table_text = parts.next().unwrap_or_default().trim();
    let collection = parts.next().map(str::trim).filter(|name| !name.is_empty());
    let columns = parts
        .next()
        .filter(|list| !list.trim().is_empty())
        .map(|list| list.split(',').map(|column| column.trim().to_owned()).collect::<Vec<_>>());
    let (refs, payload) = refs::parse_extras(spec, parts.next().unwrap_or_default())?;
    if table_text.is_empty() || table_text.split('.').any(str::is_empty) {
        return Err(format!(
            "--pg-table `{spec}`: takes TABLE[:COLLECTION[:COLUMNS[:EXTRAS]]], TABLE as name or schema.name"
        ));
    }
    let table = TableName::parse(table_text);
    let collection = collection.unwrap_or(&table.name).to_owned();
    if collection.is_empty() || collection.len() > MAX_COLLECTION_NAME_BYTES || is_reserved_name(&collection) {
        return Err(format!(
            "--pg-table `{spec}`: the collection name is 1..={MAX_COLLECTION_NAME_BYTES} bytes and does not start with `_ordo`"
        ));
    }
    if columns.as_ref().is_some_and(|columns| columns.iter().any(String::is_empty)) {
        return Err(format!("--pg-table `{spec}`: an empty column name"));
    }
    Ok(TableMapping { table, collection, columns, refs, payload })
}

/// The password from `--pg-password-file`, else `ORDO_PG_PASSWORD`, else none.
fn read_password(file: Option<&PathBuf>) -> Result<Option<String>, String> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read --pg-password-file {}: {error}", path.display()))?;
        let password = text.trim_end_matches(['\n', '\r']).to_owned();
        if password.is_empty() {
            return Err(format!("--pg-password-file {} is empty", path.display()));
        }
        return Ok(Some(password));
    }
    Ok(std::env::var("ORDO_PG_PASSWORD").ok().filter(|password| !password.is_empty()))
}

// --- TLS (`--pg-tls`, `--pg-tls-ca-file`) ---

/// The TLS the connections use: see `--pg-tls`. Never a silent fall-back: when
/// TLS is on, a server that declines it, or whose certificate does not chain
/// to the CA or name the host, is refused.
fn tls_of(args: &ServeArgs, host: &Host) -> Result<Option<Tls>, String> {
    let ca_file = args.pg_tls_ca_file.as_deref();
    let on = match (args.pg_tls.as_str(), host) {
        ("disable", _) => {
            if ca_file.is_some() {
                return Err("--pg-tls-ca-file with --pg-tls disable: choose one".to_owned());
            }
            false
        }
        (_, Host::UnixSocketDir(_)) if args.pg_tls == "require" || ca_file.is_some() => {
            return Err("--pg-tls require / --pg-tls-ca-file: PostgreSQL has no TLS over a Unix socket (--pg-host is a directory)".to_owned());
        }
        (_, Host::UnixSocketDir(_)) => false,
        ("require", Host::Tcp(_)) => true,
        (_, Host::Tcp(name)) => ca_file.is_some() || !is_loopback(name),
    };
    if !on {
        return Ok(None);
    }
    Tls::new(ca_file).map(Some).map_err(|error| format!("--pg-tls: {error}"))
}

/// `localhost` or a loopback address: traffic that never leaves the machine.
pub fn is_loopback(host: &str) -> bool {
    let bracketless = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bracketless.parse::<std::net::IpAddr>().is_ok_and(|address| address.is_loopback())
}

/// The TOML file's `[[postgres.table]]` entries (`name`, optional `collection`,
/// `columns`, `refs` and `payload`) as `--pg-table` values.
pub fn toml_tables(value: &toml::Value, file: &str) -> Result<Vec<String>, String> {
    let shape = || {
        format!("{file}: `postgres` takes `[[postgres.table]]` entries with `name`, `collection`, `columns`, `refs`, `payload`")
    };
    let section = value.as_table().ok_or_else(shape)?;
    if section.keys().any(|key| key != "table") {
        return Err(shape());
    }
    let Some(entries) = section.get("table") else { return Ok(Vec::new()) };
    let entries = entries.as_array().ok_or_else(shape)?;
    let mut specs = Vec::with_capacity(entries.len());
    for entry in entries {
        let entry = entry.as_table().ok_or_else(shape)?;
        if entry.keys().any(|key| !matches!(key.as_str(), "name" | "collection" | "columns" | "refs" | "payload")) {
            return Err(shape());
        }
        let name = entry.get("name").and_then(toml::Value::as_str).ok_or_else(shape)?;
        let collection = match entry.get("collection") {
            Some(collection) => collection.as_str().ok_or_else(shape)?,
            None => "",
        };
        let mut spec = format!("{name}:{collection}");
        let extras = refs::toml_extras(entry, &shape)?;
        if entry.contains_key("columns") || extras.is_some() {
            spec.push(':');
        }
        if let Some(columns) = entry.get("columns") {
            let columns = columns.as_array().ok_or_else(shape)?;
            let names: Option<Vec<&str>> = columns.iter().map(toml::Value::as_str).collect();
            spec.push_str(&names.ok_or_else(shape)?.join(","));
        }
        if let Some(extras) = extras {
            spec.push(':');
            spec.push_str(&extras);
        }
        if name.contains(':') || collection.contains(':') || spec.contains(';') {
            return Err(format!("{file}: `[[postgres.table]]` names hold no `:` or `;`"));
        }
        specs.push(spec);
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_spec_names_table_collection_and_columns() {
        let mapping = parse_table("chat.messages:msgs:body, sent_at").unwrap();
        assert_eq!(mapping.table, TableName { schema: "chat".into(), name: "messages".into() });
        assert_eq!(mapping.collection, "msgs");
        assert_eq!(mapping.columns, Some(vec!["body".to_owned(), "sent_at".to_owned()]));
        let plain = parse_table("rooms").unwrap();
        assert_eq!((plain.collection.as_str(), plain.columns), ("rooms", None));
        assert_eq!(parse_table("rooms::title").unwrap().collection, "rooms");
    }

    #[test]
    fn bad_table_specs_are_refused() {
        for spec in ["", ":x", "a.:x", "rooms:_ordo/rules", "rooms:x:a,,b"] {
            assert!(parse_table(spec).is_err(), "{spec}");
        }
    }

    /// `ordo serve --config FILE`'s options as the server gets them.
    fn serve_options(args: &[&str]) -> Result<crate::server::ServeOptions, String> {
        let cli = crate::cli::parse(["ordo", "serve"].iter().chain(args)).map_err(|error| error.to_string())?;
        let crate::cli::Command::Serve(serve) = cli.command else { panic!("not serve") };
        serve.into_options()
    }

    #[test]
    fn a_config_file_names_the_followed_tables_and_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("pw");
        std::fs::write(&password, "secret\n").unwrap();
        let config = dir.path().join("ordo.toml");
        let toml = format!(
            "pg-host = \"/run/pg\"\npg-slot = \"s1\"\npg-password-file = \"{}\"\n\
             [[postgres.table]]\nname = \"chat.rooms\"\n\
             [[postgres.table]]\nname = \"messages\"\ncollection = \"msgs\"\ncolumns = [\"body\"]\n",
            password.display()
        );
        std::fs::write(&config, toml).unwrap();
        let options = serve_options(&["--config", config.to_str().unwrap()]).unwrap();
        let postgres = options.postgres.expect("tables followed");
        assert_eq!(postgres.connect.host, Host::UnixSocketDir("/run/pg".into()));
        assert_eq!(postgres.connect.password.as_deref(), Some("secret"));
        assert_eq!(postgres.slot, "s1");
        let collections: Vec<&str> = postgres.tables.iter().map(|table| table.collection.as_str()).collect();
        assert_eq!(collections, ["rooms", "msgs"]);
        assert_eq!(postgres.tables[1].columns, Some(vec!["body".to_owned()]));
        // The password is never in the options' debug text.
        assert!(!format!("{postgres:?}").contains("secret"));
        // A flag wins over the file.
        let options = serve_options(&["--config", config.to_str().unwrap(), "--pg-table", "other"]).unwrap();
        assert_eq!(options.postgres.unwrap().tables.len(), 1);
    }

    #[test]
    fn the_publication_is_created_only_when_asked_by_flag_or_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("ordo.toml");
        std::fs::write(&config, "pg-create-publication = true\n").unwrap();
        let create_publication = |args: &[&str]| {
            let mut all = vec!["--pg-table", "t"];
            all.extend(args);
            serve_options(&all).unwrap().postgres.unwrap().create_publication
        };
        assert!(!create_publication(&[]));
        assert!(create_publication(&["--pg-create-publication"]));
        assert!(create_publication(&["--config", config.to_str().unwrap()]));
    }

    #[test]
    fn tls_is_on_off_the_machine_off_on_a_socket_and_refused_where_it_cannot_be() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate").unwrap();
        let tls = |args: &[&str]| {
            let mut all = vec!["--pg-table", "t"];
            all.extend(args);
            serve_options(&all).map(|options| options.postgres.unwrap().connect.tls)
        };
        assert_eq!(tls(&["--pg-host", "/run/pg"]).unwrap(), None);
        assert_eq!(tls(&["--pg-host", "localhost"]).unwrap(), None);
        assert_eq!(tls(&["--pg-host", "127.0.0.1"]).unwrap(), None);
        assert_eq!(tls(&["--pg-host", "::1"]).unwrap(), None);
        assert_eq!(tls(&["--pg-host", "db.example.com", "--pg-tls", "disable"]).unwrap(), None);
        for refused in [
            &["--pg-host", "/run/pg", "--pg-tls", "require"][..],
            &["--pg-host", "/run/pg", "--pg-tls-ca-file", ca.to_str().unwrap()],
            &["--pg-host", "db.example.com", "--pg-tls", "disable", "--pg-tls-ca-file", ca.to_str().unwrap()],
        ] {
            assert!(tls(refused).is_err(), "{refused:?}");
        }
        // On: the CA file is read at start, so a bad one refuses the start.
        for on in
            [&["--pg-host", "127.0.0.1", "--pg-tls-ca-file"][..], &["--pg-host", "db.example.com", "--pg-tls-ca-file"]]
        {
            let mut args = on.to_vec();
            args.push(ca.to_str().unwrap());
            let error = tls(&args).unwrap_err();
            assert!(error.contains("holds no PEM certificate"), "{error}");
        }
        assert!(tls(&["--pg-host", "localhost", "--pg-tls", "require", "--pg-tls-ca-file", "/nonexistent"]).is_err());
    }

    #[test]
    fn toml_tables_become_flag_values() {
        let value: toml::Value =
            toml::from_str("[[table]]\nname = \"rooms\"\n[[table]]\nname = \"messages\"\ncollection = \"msgs\"\ncolumns = [\"body\"]\n")
                .unwrap();
        assert_eq!(toml_tables(&value, "f").unwrap(), vec!["rooms:".to_owned(), "messages:msgs:body".to_owned()]);
        let wrong: toml::Value = toml::from_str("[[table]]\nname = \"rooms\"\nkey = \"id\"\n").unwrap();
        assert!(toml_tables(&wrong, "f").is_err());
    }
}
