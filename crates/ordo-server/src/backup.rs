//! `POST /v1/backup` (admin only): a hot backup of the data directory into a
//! directory on the server's machine, while writes go on (docs/STORAGE.md,
//! "Backup"). The writer thread only starts it (`Command::StartBackup`: it pins
//! the log, no I/O); LMDB's copy and the log tail are written on a blocking
//! thread, so no write waits for the copy.

use std::path::PathBuf;

use serde::Deserialize;
use tokio::sync::oneshot;

use crate::error::ApiError;
use crate::http_state::HttpState;
use crate::limits;
use crate::writer::Command;

/// `{"to":"/absolute/path"}`
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupRequest {
    pub to: String,
}

/// Runs a backup to the request's directory; answers
/// `{"seq":N,"checkpointed_seq":C,"bytes":B,"to":"/path"}`: the backup holds
/// exactly the batches 1..=N.
pub(crate) async fn backup(state: &HttpState, body: &[u8]) -> Result<Vec<u8>, ApiError> {
    let request: BackupRequest = crate::strict_json::parse(body, "the body")?;
    if request.to.len() > limits::MAX_BACKUP_PATH_BYTES {
        return Err(ApiError::limit(format!(
            "`to` is {} bytes; at most {} are allowed",
            request.to.len(),
            limits::MAX_BACKUP_PATH_BYTES
        )));
    }
    let to = PathBuf::from(&request.to);
    if !to.is_absolute() {
        return Err(ApiError::bad_request(format!(
            "`to` must be an absolute path on the server, not `{}`",
            request.to
        )));
    }
    let (reply, answer) = oneshot::channel();
    state.writer.send(Command::StartBackup { reply }).await.map_err(|_| ApiError::shutting_down())?;
    let backup = answer.await.map_err(|_| ApiError::shutting_down())??;
    let destination = to.clone();
    let report = tokio::task::spawn_blocking(move || backup.write_to(&destination))
        .await
        .map_err(|_| ApiError::new(crate::error::ErrorCode::Internal, "the backup's thread panicked"))??;
    eprintln!(
        "ordo: backup to {} holds batches 1..={} (LMDB copy at {}, {} bytes)",
        to.display(),
        report.seq,
        report.checkpointed_seq,
        report.n_bytes
    );
    let body = serde_json::json!({
        "seq": report.seq,
        "checkpointed_seq": report.checkpointed_seq,
        "bytes": report.n_bytes,
        "to": request.to,
    });
    Ok(body.to_string().into_bytes())
}
