//! `ordo backup`: a consistent copy of a data directory that `ordo serve
//! --data-dir` starts from (docs/STORAGE.md, "Backup"). Against a running
//! server it asks for one over HTTP (`POST /v1/backup`, an admin's token);
//! on a directory no server holds, it opens the directory itself.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};

use ordo_store::{print_load_progress, BackupReport, Database, StoreError, StoreOptions};

/// `ordo backup`'s options (the command's help is on `cli::Command::Backup`).
#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    /// Where to write the backup: a directory that does not exist yet (or is empty). With --url,
    /// a path on the server's machine (a relative one is taken from this shell's directory).
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
    /// The running server to ask [default: 127.0.0.1:7070].
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "data_dir")]
    pub url: Option<String>,
    /// A file holding an admin's token, if the server has auth (or the variable ORDO_TOKEN).
    #[arg(long, value_name = "FILE", conflicts_with = "data_dir")]
    pub token_file: Option<PathBuf>,
    /// Back up this data directory, which no server may hold, without a server.
    #[arg(long, value_name = "DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

impl BackupArgs {
    /// Runs the backup; the line to print on success.
    pub fn run(self) -> Result<String, String> {
        let current = std::env::current_dir().map_err(|error| format!("the current directory: {error}"))?;
        let to = current.join(&self.to);
        let report = match self.data_dir {
            Some(dir) => from_directory(&dir, &to)?,
            None => {
                let token = match &self.token_file {
                    Some(path) => Some(
                        std::fs::read_to_string(path)
                            .map_err(|error| format!("--token-file {}: {error}", path.display()))?
                            .trim()
                            .to_owned(),
                    ),
                    None => std::env::var("ORDO_TOKEN").ok().map(|token| token.trim().to_owned()),
                };
                let url = self.url.as_deref().unwrap_or("127.0.0.1:7070");
                let address = url.trim_start_matches("http://").trim_end_matches('/');
                from_server(address, token.as_deref(), &to)?
            }
        };
        Ok(format!(
            "seq {}: {} holds exactly the batches 1..={} (LMDB copy at {} plus {} logged batches; {} bytes)",
            report.seq,
            to.display(),
            report.seq,
            report.checkpointed_seq,
            report.seq - report.checkpointed_seq,
            report.n_bytes
        ))
    }
}

/// Opens the directory as `ordo serve` would (recovering its log), copies it, closes it.
fn from_directory(dir: &Path, to: &Path) -> Result<BackupReport, String> {
    let (database, _) =
        Database::open(dir, StoreOptions::default(), &mut print_load_progress).map_err(|error| match error {
            StoreError::Locked { .. } => format!(
                "{error}. A server holds it: back it up through that server (ordo backup --to DIR --url HOST:PORT)"
            ),
            error => format!("cannot open {}: {error}", dir.display()),
        })?;
    let report = database.start_backup().and_then(|backup| backup.write_to(to)).map_err(|error| error.to_string())?;
    drop(database);
    Ok(report)
}

/// `POST /v1/backup` on the server at `address`.
fn from_server(address: &str, token: Option<&str>, to: &Path) -> Result<BackupReport, String> {
    let to_text = to.to_str().ok_or("--to must be valid UTF-8 to send to a server")?;
    let body = serde_json::json!({ "to": to_text }).to_string();
    let auth = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let mut stream = TcpStream::connect(address).map_err(|error| format!("cannot reach {address}: {error}"))?;
    let head = format!(
        "POST /v1/backup HTTP/1.1\r\nHost: {address}\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| format!("reading the answer from {address}: {e}"))?;
    let status: u16 =
        response.split(' ').nth(1).and_then(|code| code.parse().ok()).ok_or("a malformed HTTP response")?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let answer: serde_json::Value =
        serde_json::from_str(body).map_err(|_| format!("{address} answered {status}: {body}"))?;
    if status != 200 {
        let code = answer["error"]["code"].as_str().unwrap_or("?");
        let message = answer["error"]["message"].as_str().unwrap_or(body);
        return Err(format!("{address} answered {status} {code}: {message}"));
    }
    let number = |name: &str| answer[name].as_u64().ok_or_else(|| format!("the answer lacks `{name}`: {body}"));
    Ok(BackupReport { seq: number("seq")?, checkpointed_seq: number("checkpointed_seq")?, n_bytes: number("bytes")? })
}

/// `--log-segment-size`: bytes, or a number with a `K`, `M` or `G` suffix
/// (powers of 1024), within `limits::{MIN,MAX}_LOG_SEGMENT_BYTES`. Lives here
/// with the other storage options of the command line.
pub fn parse_log_segment_size(text: &str) -> Result<u64, String> {
    use crate::limits::{MAX_LOG_SEGMENT_BYTES, MIN_LOG_SEGMENT_BYTES};
    let (digits, unit) = match text.trim_end_matches(['B', 'b', 'i']).char_indices().last() {
        Some((at, 'K' | 'k')) => (&text[..at], 1u64 << 10),
        Some((at, 'M' | 'm')) => (&text[..at], 1 << 20),
        Some((at, 'G' | 'g')) => (&text[..at], 1 << 30),
        _ => (text, 1),
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| format!("--log-segment-size takes bytes (or 64M, 1G), not `{text}`"))?;
    if !(MIN_LOG_SEGMENT_BYTES..=MAX_LOG_SEGMENT_BYTES).contains(&bytes) {
        return Err(format!(
            "--log-segment-size is {MIN_LOG_SEGMENT_BYTES}..={MAX_LOG_SEGMENT_BYTES} bytes (1M..=1G), not {bytes}"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::parse_log_segment_size;

    #[test]
    fn log_segment_sizes_are_parsed_and_held_to_their_limits() {
        assert_eq!(parse_log_segment_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_log_segment_size("16M"), Ok(16 << 20));
        assert_eq!(parse_log_segment_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_log_segment_size("1024k"), Ok(1 << 20));
        assert_eq!(parse_log_segment_size("1G"), Ok(1 << 30));
        // At the edges.
        assert!(parse_log_segment_size("1048575").is_err());
        assert!(parse_log_segment_size("1073741825").is_err());
        assert!(parse_log_segment_size("2G").is_err());
        assert!(parse_log_segment_size("").is_err());
        assert!(parse_log_segment_size("M").is_err());
        assert!(parse_log_segment_size("-1").is_err());
        assert!(parse_log_segment_size("99999999999999999999G").is_err());
    }
}
