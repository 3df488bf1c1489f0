//! TLS for a TCP connection to PostgreSQL: the `SSLRequest`, then a rustls
//! handshake that verifies the server's certificate against the configured CA
//! (or the system's roots) *and* its host name, before any start-up message
//! (and so any password) is sent. A server that declines TLS is an error, never
//! a fall-back to plain TCP. The certificate's hash is kept for SCRAM channel
//! binding (`tls-server-end-point`, RFC 5929).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use sha2::{Digest, Sha256, Sha384, Sha512};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::error::Error;

/// Most certificates read from a CA file: a bundle holds a few hundred at most.
pub const MAX_CA_CERTIFICATES: usize = 4096;

/// Verified TLS: the roots the server's certificate must chain to.
#[derive(Clone)]
pub struct Tls {
    /// The PEM file the roots came from; `None`: the system's roots.
    ca_file: Option<PathBuf>,
    config: Arc<ClientConfig>,
}

impl Tls {
    /// Roots from `ca_file` (PEM, one or more certificates), else the system's.
    pub fn new(ca_file: Option<&Path>) -> Result<Tls, Error> {
        let roots = match ca_file {
            Some(path) => roots_from_file(path)?,
            None => system_roots()?,
        };
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| Error::Tls(format!("no TLS version to offer: {error}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls { ca_file: ca_file.map(Path::to_path_buf), config: Arc::new(config) })
    }

    /// The CA file, `None` for the system's roots.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }
}

impl PartialEq for Tls {
    fn eq(&self, other: &Tls) -> bool {
        self.ca_file == other.ca_file
    }
}

impl Eq for Tls {}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.ca_file {
            Some(path) => write!(f, "Tls(CA file {})", path.display()),
            None => f.write_str("Tls(system roots)"),
        }
    }
}

fn roots_from_file(path: &Path) -> Result<RootCertStore, Error> {
    let text = std::fs::read(path)
        .map_err(|error| Error::Tls(format!("cannot read the CA file {}: {error}", path.display())))?;
    let mut roots = RootCertStore::empty();
    for (index, certificate) in rustls_pemfile::certs(&mut text.as_slice()).enumerate() {
        if index >= MAX_CA_CERTIFICATES {
            return Err(Error::Tls(format!(
                "the CA file {} holds more than {MAX_CA_CERTIFICATES} certificates",
                path.display()
            )));
        }
        let certificate =
            certificate.map_err(|error| Error::Tls(format!("the CA file {} is not PEM: {error}", path.display())))?;
        roots
            .add(certificate)
            .map_err(|error| Error::Tls(format!("a certificate of the CA file {}: {error}", path.display())))?;
    }
    if roots.is_empty() {
        return Err(Error::Tls(format!("the CA file {} holds no PEM certificate", path.display())));
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, Error> {
    let certificates = rustls_native_certs::load_native_certs()
        .map_err(|error| Error::Tls(format!("cannot read the system's CA certificates: {error}")))?;
    let mut roots = RootCertStore::empty();
    let (_added, _unparsable) = roots.add_parsable_certificates(certificates);
    if roots.is_empty() {
        return Err(Error::Tls("the system has no CA certificates: give the server's CA file".into()));
    }
    Ok(roots)
}

/// Asks the server for TLS on `stream` and runs the handshake, verifying the
/// certificate for `host`. Returns the stream and the certificate's hash for
/// channel binding (`None` when its signature algorithm defines none).
pub(crate) async fn start_tls(
    tls: &Tls,
    mut stream: TcpStream,
    host: &str,
) -> Result<(TlsStream<TcpStream>, Option<Vec<u8>>), Error> {
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    stream.write_all(&request).await?;
    // Exactly one byte: anything the server sent after it before the handshake
    // would be unauthenticated (CVE-2021-23222), and it stays unread here.
    match stream.read_u8().await? {
        b'S' => {}
        b'N' => {
            return Err(Error::Tls(format!(
                "the server at {host} does not accept TLS (ssl = off) and TLS is required: turn ssl on in PostgreSQL, or give --pg-tls disable on a trusted network"
            )))
        }
        other => return Err(Error::Protocol(format!("an answer `{}` to the TLS request", other.escape_ascii()))),
    }
    let server_name = ServerName::try_from(host.to_owned())
        .map_err(|_| Error::Tls(format!("`{host}` is not a host name or address TLS can verify")))?;
    let connector = TlsConnector::from(tls.config.clone());
    let stream = connector.connect(server_name, stream).await.map_err(|error| handshake_error(error, host))?;
    let end_point = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first()).and_then(server_end_point);
    Ok((stream, end_point))
}

/// A rustls refusal (an unknown CA, a name that does not match) is a
/// configuration error naming the failure; anything else is the connection's.
fn handshake_error(error: std::io::Error, host: &str) -> Error {
    let refusal = error.get_ref().and_then(|inner| inner.downcast_ref::<tokio_rustls::rustls::Error>());
    match refusal {
        Some(refusal) => Error::Tls(format!("the TLS handshake with {host} failed: {refusal}")),
        None => Error::Io(error),
    }
}

/// The `tls-server-end-point` channel binding data: the certificate hashed
/// with its signature's hash (SHA-256 for MD5 and SHA-1), as PostgreSQL
/// computes it. `None` for an algorithm this table lacks (Ed25519, RSA-PSS,
/// SHA-224): the exchange then runs without binding.
fn server_end_point(certificate: &CertificateDer<'_>) -> Option<Vec<u8>> {
    let oid = signature_algorithm_oid(certificate.as_ref())?;
    let (_, hash) = SIGNATURE_HASHES.iter().find(|(known, _)| *known == oid)?;
    Some(match hash {
        EndPointHash::Sha256 => Sha256::digest(certificate).to_vec(),
        EndPointHash::Sha384 => Sha384::digest(certificate).to_vec(),
        EndPointHash::Sha512 => Sha512::digest(certificate).to_vec(),
    })
}

enum EndPointHash {
    Sha256,
    Sha384,
    Sha512,
}

/// Signature algorithms (their OIDs' DER content) and the hash RFC 5929 binds with.
const SIGNATURE_HASHES: [(&[u8], EndPointHash); 9] = [
    // md5WithRSAEncryption, sha1WithRSAEncryption, sha256WithRSAEncryption (1.2.840.113549.1.1.4/5/11).
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x04], EndPointHash::Sha256),
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05], EndPointHash::Sha256),
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b], EndPointHash::Sha256),
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c], EndPointHash::Sha384),
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d], EndPointHash::Sha512),
    // ecdsa-with-SHA1 (1.2.840.10045.4.1), ecdsa-with-SHA256/384/512 (1.2.840.10045.4.3.2/3/4).
    (&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01], EndPointHash::Sha256),
    (&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02], EndPointHash::Sha256),
    (&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03], EndPointHash::Sha384),
    (&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04], EndPointHash::Sha512),
];

/// The OID (its DER content) of `Certificate.signatureAlgorithm`:
/// `SEQUENCE { tbsCertificate SEQUENCE, signatureAlgorithm SEQUENCE { OID, ... }, ... }`.
fn signature_algorithm_oid(der: &[u8]) -> Option<&[u8]> {
    let (tag, certificate, _) = der_element(der)?;
    if tag != 0x30 {
        return None;
    }
    let (_, _, after_tbs) = der_element(certificate)?;
    let (tag, algorithm, _) = der_element(after_tbs)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, oid, _) = der_element(algorithm)?;
    (tag == 0x06).then_some(oid)
}

/// One DER element: its tag, its content, and what follows it.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n_bytes = usize::from(first & 0x7f);
        if n_bytes == 0 || n_bytes > 4 || rest.len() < n_bytes {
            return None;
        }
        let length = rest[..n_bytes].iter().fold(0usize, |length, byte| (length << 8) | usize::from(*byte));
        (length, &rest[n_bytes..])
    };
    (rest.len() >= length).then(|| (tag, &rest[..length], &rest[length..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_der_element_is_read_with_short_and_long_lengths_and_truncation_is_refused() {
        assert_eq!(der_element(&[0x06, 2, 1, 2, 9]), Some((0x06, &[1u8, 2][..], &[9u8][..])));
        let mut long = vec![0x04, 0x81, 200];
        long.extend(std::iter::repeat_n(7, 200));
        assert_eq!(der_element(&long).map(|(_, content, rest)| (content.len(), rest.len())), Some((200, 0)));
        assert_eq!(der_element(&[0x04, 5, 1, 2]), None);
        assert_eq!(der_element(&[0x04, 0x85, 1, 1, 1, 1, 1]), None);
        assert_eq!(der_element(&[]), None);
    }
}
