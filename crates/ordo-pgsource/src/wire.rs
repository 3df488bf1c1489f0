//! A PostgreSQL connection that speaks just what following needs: TLS over TCP
//! (`tls.rs`), start-up and authentication (SCRAM-SHA-256 with channel binding
//! over TLS, MD5, cleartext, trust), the simple query
//! protocol with rows handed over one at a time, and copy-both mode for
//! `START_REPLICATION`. Messages are built and parsed by the `postgres-protocol`
//! crate; this module only sequences them (that crate has no copy-both
//! response, so its `W` message is read here).

use std::path::PathBuf;

use bytes::{Buf, Bytes, BytesMut};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS};
use postgres_protocol::message::{backend, frontend};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{Error, ServerError};
use crate::tls::{start_tls, Tls};

/// The session settings every connection starts with, so that values print in
/// the text forms `value::parse_value` reads, whatever the server's defaults.
pub const SESSION_SETTINGS: [(&str, &str); 4] =
    [("DateStyle", "ISO"), ("TimeZone", "UTC"), ("extra_float_digits", "3"), ("client_encoding", "UTF8")];

/// The largest message accepted: a value PostgreSQL sends is at most 1 GiB, and
/// a message holding one is a little larger. A length beyond this is refused
/// before anything is allocated for it.
pub const MAX_MESSAGE_BYTES: usize = (1 << 30) + (1 << 20);

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// The directory of its Unix socket (`.s.PGSQL.<port>` in it).
    UnixSocketDir(PathBuf),
    /// A host name or address for TCP.
    Tcp(String),
}

/// How to reach and log into the server.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectConfig {
    pub host: Host,
    pub port: u16,
    pub user: String,
    /// Never printed: `Debug` shows whether there is one, not what it is.
    pub password: Option<String>,
    pub database: String,
    pub application_name: String,
    /// TLS with verification (TCP only); `None`: plain TCP, or a Unix socket.
    pub tls: Option<Tls>,
}

impl std::fmt::Debug for ConnectConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<set>"))
            .field("database", &self.database)
            .field("application_name", &self.application_name)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Whether the connection is a logical replication one (`replication=database`):
/// it then accepts replication commands as well as SQL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Sql,
    Replication,
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A logged-in connection, idle between queries.
pub struct Connection {
    stream: Box<dyn Stream>,
    read_buffer: BytesMut,
    write_buffer: BytesMut,
    /// The backend's process id, so a test can terminate it.
    pub backend_pid: i32,
}

/// A backend message, with the copy-both response `postgres-protocol` lacks.
enum Incoming {
    CopyBothResponse,
    Other(backend::Message),
}

impl Connection {
    /// Connects (over TLS when `config.tls` says so) and logs in; returns once
    /// the server is ready for a query.
    pub async fn connect(config: &ConnectConfig, mode: Mode) -> Result<Connection, Error> {
        let (stream, end_point): (Box<dyn Stream>, _) = match (&config.host, &config.tls) {
            (Host::UnixSocketDir(_), Some(_)) => {
                return Err(Error::Tls("PostgreSQL has no TLS over a Unix socket".into()));
            }
            (Host::UnixSocketDir(dir), None) => {
                (Box::new(tokio::net::UnixStream::connect(dir.join(format!(".s.PGSQL.{}", config.port))).await?), None)
            }
            (Host::Tcp(host), tls) => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), config.port)).await?;
                stream.set_nodelay(true)?;
                match tls {
                    Some(tls) => {
                        let (stream, end_point) = start_tls(tls, stream, host).await?;
                        (Box::new(stream), Some(end_point))
                    }
                    None => (Box::new(stream), None),
                }
            }
        };
        let mut connection = Connection {
            stream,
            read_buffer: BytesMut::with_capacity(64 * 1024),
            write_buffer: BytesMut::new(),
            backend_pid: 0,
        };
        connection.start_up(config, mode, end_point).await?;
        Ok(connection)
    }

    /// `end_point`: over TLS, the server certificate's channel binding data
    /// (`Some(None)` when its algorithm has none); `None` without TLS.
    async fn start_up(
        &mut self,
        config: &ConnectConfig,
        mode: Mode,
        end_point: Option<Option<Vec<u8>>>,
    ) -> Result<(), Error> {
        let mut parameters = vec![
            ("user", config.user.as_str()),
            ("database", config.database.as_str()),
            ("application_name", config.application_name.as_str()),
        ];
        if mode == Mode::Replication {
            parameters.push(("replication", "database"));
        }
        parameters.extend(SESSION_SETTINGS);
        frontend::startup_message(parameters, &mut self.write_buffer)?;
        self.flush().await?;
        self.authenticate(config, end_point).await?;
        loop {
            match self.next_message().await? {
                backend::Message::BackendKeyData(body) => self.backend_pid = body.process_id(),
                backend::Message::ReadyForQuery(_) => return Ok(()),
                backend::Message::ErrorResponse(body) => return Err(Error::Server(server_error(&body))),
                _ => {}
            }
        }
    }

    /// Answers the server's authentication request until it says `AuthenticationOk`.
    async fn authenticate(&mut self, config: &ConnectConfig, end_point: Option<Option<Vec<u8>>>) -> Result<(), Error> {
        let password = || {
            config
                .password
                .as_deref()
                .ok_or_else(|| Error::Authentication("the server asks for a password and none is configured".into()))
        };
        match self.next_message().await? {
            backend::Message::AuthenticationOk => return Ok(()),
            backend::Message::AuthenticationCleartextPassword => {
                frontend::password_message(password()?.as_bytes(), &mut self.write_buffer)?;
            }
            backend::Message::AuthenticationMd5Password(body) => {
                let hash = md5_hash(config.user.as_bytes(), password()?.as_bytes(), body.salt());
                frontend::password_message(hash.as_bytes(), &mut self.write_buffer)?;
            }
            backend::Message::AuthenticationSasl(body) => {
                return self.authenticate_scram(password()?, body, end_point).await;
            }
            backend::Message::ErrorResponse(body) => return Err(Error::Server(server_error(&body))),
            _ => return Err(Error::Authentication("the server asks for a method this client does not speak".into())),
        }
        self.flush().await?;
        self.expect_authentication_ok().await
    }

    async fn authenticate_scram(
        &mut self,
        password: &str,
        body: backend::AuthenticationSaslBody,
        end_point: Option<Option<Vec<u8>>>,
    ) -> Result<(), Error> {
        use fallible_iterator::FallibleIterator;
        let mechanisms: Vec<String> = body.mechanisms().map(|mechanism| Ok(mechanism.to_owned())).collect()?;
        let offers = |name: &str| mechanisms.iter().any(|mechanism| mechanism == name);
        if !offers(SCRAM_SHA_256) && !offers(SCRAM_SHA_256_PLUS) {
            return Err(Error::Authentication("the server offers no SCRAM-SHA-256".into()));
        }
        // Over TLS the exchange is bound to the server's certificate
        // (SCRAM-SHA-256-PLUS): a proxy holding another certificate that passed
        // verification still cannot relay it. `unrequested` tells a server that
        // offers no binding over TLS that the client could have bound: a server
        // that did offer it then refuses, so an offer stripped in transit shows.
        let (mechanism, binding) = match end_point {
            Some(Some(hash)) if offers(SCRAM_SHA_256_PLUS) => {
                (SCRAM_SHA_256_PLUS, ChannelBinding::tls_server_end_point(hash))
            }
            Some(Some(_)) => (SCRAM_SHA_256, ChannelBinding::unrequested()),
            // No TLS (a Unix socket, plain TCP), or a certificate whose
            // algorithm defines no binding data.
            Some(None) | None => (SCRAM_SHA_256, ChannelBinding::unsupported()),
        };
        if !offers(mechanism) {
            return Err(Error::Authentication(format!("the server offers no {mechanism}")));
        }
        let mut scram = ScramSha256::new(password.as_bytes(), binding);
        frontend::sasl_initial_response(mechanism, scram.message(), &mut self.write_buffer)?;
        self.flush().await?;
        match self.next_message().await? {
            backend::Message::AuthenticationSaslContinue(body) => scram.update(body.data())?,
            backend::Message::ErrorResponse(body) => return Err(Error::Server(server_error(&body))),
            _ => return Err(Error::Protocol("no SASL continue in the SCRAM exchange".into())),
        }
        frontend::sasl_response(scram.message(), &mut self.write_buffer)?;
        self.flush().await?;
        match self.next_message().await? {
            backend::Message::AuthenticationSaslFinal(body) => {
                // Verifies the server's signature: a server that does not know the
                // password cannot pass itself off as the real one.
                scram
                    .finish(body.data())
                    .map_err(|error| Error::Authentication(format!("the server's SCRAM proof: {error}")))?
            }
            backend::Message::ErrorResponse(body) => return Err(Error::Server(server_error(&body))),
            _ => return Err(Error::Protocol("no SASL final in the SCRAM exchange".into())),
        }
        self.expect_authentication_ok().await
    }

    async fn expect_authentication_ok(&mut self) -> Result<(), Error> {
        match self.next_message().await? {
            backend::Message::AuthenticationOk => Ok(()),
            backend::Message::ErrorResponse(body) => Err(Error::Server(server_error(&body))),
            _ => Err(Error::Protocol("no AuthenticationOk after the password".into())),
        }
    }

    /// Runs `sql` (one or more statements) by the simple query protocol and hands
    /// every row to `on_row`, one at a time as it arrives (a `None` column is
    /// NULL), so a large table is never held whole. The first error, the
    /// server's or `on_row`'s, is returned once the server is ready again.
    pub async fn simple_query<F>(&mut self, sql: &str, mut on_row: F) -> Result<(), Error>
    where
        F: FnMut(&[Option<&str>]) -> Result<(), Error>,
    {
        frontend::query(sql, &mut self.write_buffer)?;
        self.flush().await?;
        let mut first_error = None;
        loop {
            match self.next_message().await? {
                backend::Message::DataRow(row) if first_error.is_none() => {
                    let mut columns = Vec::new();
                    let row_result = decode_row(&row, &mut columns).and_then(|()| on_row(&columns));
                    if let Err(error) = row_result {
                        first_error = Some(error);
                    }
                }
                backend::Message::ErrorResponse(body) => {
                    first_error.get_or_insert(Error::Server(server_error(&body)));
                }
                backend::Message::ReadyForQuery(_) => return first_error.map_or(Ok(()), Err),
                backend::Message::CopyInResponse(_) | backend::Message::CopyOutResponse(_) => {
                    return Err(Error::Protocol("a COPY in a simple query".into()))
                }
                _ => {}
            }
        }
    }

    /// Runs `sql` and returns its rows, each column as text or `None` for NULL.
    /// For small catalog answers; large ones go through [`Self::simple_query`].
    pub async fn query_rows(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, Error> {
        let mut rows = Vec::new();
        self.simple_query(sql, |row| {
            rows.push(row.iter().map(|column| column.map(str::to_owned)).collect());
            Ok(())
        })
        .await?;
        Ok(rows)
    }

    /// Runs `sql` for its effect.
    pub async fn execute(&mut self, sql: &str) -> Result<(), Error> {
        self.simple_query(sql, |_| Ok(())).await
    }

    /// Sends `command` (`START_REPLICATION ...`) and waits until the server
    /// enters copy-both mode; its error otherwise.
    pub async fn start_copy_both(&mut self, command: &str) -> Result<(), Error> {
        frontend::query(command, &mut self.write_buffer)?;
        self.flush().await?;
        loop {
            match self.next_incoming().await? {
                Incoming::CopyBothResponse => return Ok(()),
                Incoming::Other(backend::Message::ErrorResponse(body)) => {
                    let error = server_error(&body);
                    self.wait_ready().await?;
                    return Err(Error::Server(error));
                }
                Incoming::Other(backend::Message::NoticeResponse(_) | backend::Message::ParameterStatus(_)) => {}
                Incoming::Other(_) => return Err(Error::Protocol("no copy-both response to START_REPLICATION".into())),
            }
        }
    }

    async fn wait_ready(&mut self) -> Result<(), Error> {
        while !matches!(self.next_message().await?, backend::Message::ReadyForQuery(_)) {}
        Ok(())
    }

    /// The next `CopyData` payload of copy-both mode; `None` when the server ends
    /// the copy. Cancel-safe: what was read stays buffered for the next call.
    pub async fn read_copy_data(&mut self) -> Result<Option<Bytes>, Error> {
        loop {
            match self.next_message().await? {
                backend::Message::CopyData(body) => return Ok(Some(body.into_bytes())),
                backend::Message::CopyDone => return Ok(None),
                backend::Message::ErrorResponse(body) => return Err(Error::Server(server_error(&body))),
                backend::Message::NoticeResponse(_) | backend::Message::ParameterStatus(_) => {}
                _ => return Err(Error::Protocol("a message other than CopyData in copy-both mode".into())),
            }
        }
    }

    /// [`Connection::read_copy_data`] without waiting: `None` when no whole
    /// message is buffered or readable from the socket at once.
    pub fn read_copy_data_now(&mut self) -> Option<Result<Option<Bytes>, Error>> {
        use futures_util::FutureExt;
        // Cancel-safe (see `read_copy_data`), so a pending read loses nothing.
        self.read_copy_data().now_or_never()
    }

    /// Sends one `CopyData` message in copy-both mode.
    pub async fn write_copy_data(&mut self, payload: &[u8]) -> Result<(), Error> {
        frontend::CopyData::new(payload)?.write(&mut self.write_buffer);
        self.flush().await
    }

    /// Says goodbye; the server closes the connection.
    pub async fn terminate(mut self) -> Result<(), Error> {
        frontend::terminate(&mut self.write_buffer);
        self.flush().await
    }

    async fn flush(&mut self) -> Result<(), Error> {
        self.stream.write_all(&self.write_buffer).await?;
        self.write_buffer.clear();
        self.stream.flush().await?;
        Ok(())
    }

    /// The next message other than a notice or a parameter status.
    async fn next_message(&mut self) -> Result<backend::Message, Error> {
        loop {
            match self.next_incoming().await? {
                Incoming::CopyBothResponse => return Err(Error::Protocol("an unexpected copy-both response".into())),
                Incoming::Other(backend::Message::NoticeResponse(_) | backend::Message::ParameterStatus(_)) => {}
                Incoming::Other(message) => return Ok(message),
            }
        }
    }

    async fn next_incoming(&mut self) -> Result<Incoming, Error> {
        loop {
            if let Some(incoming) = self.parse_buffered()? {
                return Ok(incoming);
            }
            if self.stream.read_buf(&mut self.read_buffer).await? == 0 {
                return Err(Error::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }

    fn parse_buffered(&mut self) -> Result<Option<Incoming>, Error> {
        if self.read_buffer.len() < 5 {
            return Ok(None);
        }
        let length = u32::from_be_bytes(self.read_buffer[1..5].try_into().expect("4 bytes")) as usize;
        if length > MAX_MESSAGE_BYTES {
            return Err(Error::Protocol(format!("a message of {length} bytes, more than {MAX_MESSAGE_BYTES}")));
        }
        if self.read_buffer[0] == b'W' {
            if self.read_buffer.len() < 1 + length {
                self.read_buffer.reserve(1 + length - self.read_buffer.len());
                return Ok(None);
            }
            self.read_buffer.advance(1 + length);
            return Ok(Some(Incoming::CopyBothResponse));
        }
        Ok(backend::Message::parse(&mut self.read_buffer)?.map(Incoming::Other))
    }
}

fn decode_row<'a>(row: &'a backend::DataRowBody, columns: &mut Vec<Option<&'a str>>) -> Result<(), Error> {
    use fallible_iterator::FallibleIterator;
    let buffer = row.buffer();
    let mut ranges = row.ranges();
    while let Some(range) = ranges.next()? {
        let column = match range {
            Some(range) => Some(
                std::str::from_utf8(&buffer[range])
                    .map_err(|_| Error::Protocol("a column that is not UTF-8".into()))?,
            ),
            None => None,
        };
        columns.push(column);
    }
    Ok(())
}

fn server_error(body: &backend::ErrorResponseBody) -> ServerError {
    use fallible_iterator::FallibleIterator;
    let mut error = ServerError { severity: String::new(), code: String::new(), message: String::new(), detail: None };
    let mut fields = body.fields();
    while let Ok(Some(field)) = fields.next() {
        let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
        match field.type_() {
            b'S' => error.severity = value,
            b'C' => error.code = value,
            b'M' => error.message = value,
            b'D' => error.detail = Some(value),
            _ => {}
        }
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::UnixListener;

    /// Reads one frontend message after the start-up packet: its tag and body.
    async fn read_message(stream: &mut tokio::net::UnixStream) -> (u8, Vec<u8>) {
        let tag = stream.read_u8().await.unwrap();
        let length = stream.read_u32().await.unwrap() as usize;
        let mut body = vec![0; length - 4];
        stream.read_exact(&mut body).await.unwrap();
        (tag, body)
    }

    async fn write_authentication(stream: &mut tokio::net::UnixStream, code: u32, data: &[u8]) {
        let mut message = vec![b'R'];
        message.extend_from_slice(&(8 + data.len() as u32).to_be_bytes());
        message.extend_from_slice(&code.to_be_bytes());
        message.extend_from_slice(data);
        stream.write_all(&message).await.unwrap();
    }

    /// A server that runs SCRAM without knowing the password: its final proof
    /// (`v=`) is made up. It then says the login succeeded.
    async fn impostor(listener: UnixListener) {
        let (mut stream, _) = listener.accept().await.unwrap();
        let length = stream.read_u32().await.unwrap() as usize;
        let mut startup = vec![0; length - 4];
        stream.read_exact(&mut startup).await.unwrap();
        write_authentication(&mut stream, 10, b"SCRAM-SHA-256\0\0").await;
        let (_, initial) = read_message(&mut stream).await;
        let client_first = String::from_utf8_lossy(&initial).into_owned();
        let nonce = client_first.split("r=").nth(1).unwrap().trim_end_matches('\0').to_owned();
        let server_first = format!("r={nonce}impostor,s=c2FsdA==,i=4096");
        write_authentication(&mut stream, 11, server_first.as_bytes()).await;
        let _client_final = read_message(&mut stream).await;
        write_authentication(&mut stream, 12, b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").await;
        write_authentication(&mut stream, 0, b"").await;
        stream.write_all(&[b'Z', 0, 0, 0, 5, b'I']).await.unwrap();
        // Holds the connection open until the client is done with it.
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_server_that_cannot_prove_it_knows_the_password_is_refused() {
        let dir = std::env::temp_dir().join(format!("ordo-pgsource-scram-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join(".s.PGSQL.5432")).unwrap();
        let server = tokio::spawn(impostor(listener));
        let config = ConnectConfig {
            host: Host::UnixSocketDir(dir.clone()),
            port: 5432,
            user: "ordo".into(),
            password: Some("secret".into()),
            database: "postgres".into(),
            application_name: "test".into(),
            tls: None,
        };
        let result = Connection::connect(&config, Mode::Replication).await;
        server.abort();
        let _ = std::fs::remove_dir_all(&dir);
        match result {
            Err(Error::Authentication(message)) => assert!(message.contains("SCRAM proof"), "{message}"),
            Err(other) => panic!("refused for another reason: {other}"),
            Ok(_) => panic!("an impostor server was accepted"),
        }
    }
}
