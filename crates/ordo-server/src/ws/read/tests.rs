//! The frame reader against a reference: random client conversations framed
//! by fastwebsockets' client (which masks every frame with a random key) and
//! cut into reads of random sizes, each read back as the events a naive model
//! of RFC 6455 expects; then each violation the reader refuses, alone.

use fastwebsockets::{Frame, OpCode, Payload, Role, WebSocket};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::{FrameReader, Inbound, RETAINED_READ_BYTES};
use crate::limits;
use crate::rng::Rng;
use crate::ws::{CLOSE_NOT_UTF8, CLOSE_PROTOCOL_ERROR, CLOSE_TOO_BIG};

/// An event, comparable: what `Inbound` says, payloads included.
#[derive(PartialEq, Eq)]
enum Event {
    Text(Vec<u8>),
    Binary,
    Reply(u8, Vec<u8>),
    Closed,
    Fatal(u16),
}

/// Long payloads shown by their length and start, so that a failure stays readable.
impl std::fmt::Debug for Event {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |bytes: &[u8]| {
            format!("{} bytes {:?}", bytes.len(), String::from_utf8_lossy(&bytes[..bytes.len().min(32)]))
        };
        match self {
            Event::Text(text) => write!(formatter, "Text({})", shown(text)),
            Event::Binary => write!(formatter, "Binary"),
            Event::Reply(opcode, payload) => write!(formatter, "Reply({opcode}, {})", shown(payload)),
            Event::Closed => write!(formatter, "Closed"),
            Event::Fatal(code) => write!(formatter, "Fatal({code})"),
        }
    }
}

fn event(inbound: Inbound) -> Event {
    match inbound {
        Inbound::Text(text) => Event::Text(text),
        Inbound::Binary => Event::Binary,
        Inbound::Reply(opcode, payload) => Event::Reply(opcode as u8, payload),
        Inbound::Closed => Event::Closed,
        Inbound::Fatal(code, _) => Event::Fatal(code),
    }
}

/// Reads `stream` to its end as the connection task does, sending each event to `inbound`.
async fn read_frames(mut stream: impl tokio::io::AsyncRead + Unpin, inbound: mpsc::Sender<Inbound>) {
    let mut reader = FrameReader::default();
    loop {
        for event in reader.next_events(&mut stream).await.into_iter().flatten() {
            let last = matches!(event, Inbound::Closed | Inbound::Fatal(..));
            if inbound.send(event).await.is_err() || last {
                return;
            }
        }
    }
}

/// A frame as the client sends it.
struct ClientFrame {
    fin: bool,
    opcode: OpCode,
    payload: Vec<u8>,
}

fn frame(fin: bool, opcode: OpCode, payload: &[u8]) -> ClientFrame {
    ClientFrame { fin, opcode, payload: payload.to_vec() }
}

/// The events `frames` produce, read through a pipe that passes at most
/// `read_size` bytes per read; the frames are masked and framed by
/// fastwebsockets' client.
fn read_through(frames: Vec<ClientFrame>, read_size: usize) -> Vec<Event> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let (client_end, server_end) = tokio::io::duplex(read_size);
        let writer = tokio::spawn(async move {
            let mut client = WebSocket::after_handshake(client_end, Role::Client);
            client.set_auto_close(false);
            for ClientFrame { fin, opcode, payload } in frames {
                let sent = client.write_frame(Frame::new(fin, opcode, None, Payload::Owned(payload))).await;
                if sent.is_err() {
                    break; // The reader stopped (a violation): the rest is not read.
                }
            }
            let _ = client.into_inner().shutdown().await;
        });
        let (sender, mut receiver) = mpsc::channel(4);
        let reader = tokio::spawn(read_frames(server_end, sender));
        let mut events = Vec::new();
        while let Some(inbound) = receiver.recv().await {
            events.push(event(inbound));
        }
        reader.await.unwrap();
        writer.abort();
        events
    })
}

/// Random bytes, valid UTF-8 when `text` (multi-byte characters included, so
/// that fragments cut through them).
fn random_payload(rng: &mut Rng, text: bool, max_len: usize) -> Vec<u8> {
    let len = rng.index(max_len + 1);
    if !text {
        return (0..len).map(|_| rng.next_u64() as u8).collect();
    }
    let mut string = String::new();
    while string.len() < len {
        string.push(*rng.pick(&['a', '{', '"', 'é', '€', '𝄞', ' ']));
    }
    string.into_bytes()
}

/// A random, valid conversation with messages of up to `max_len` bytes, cut
/// into fragments with pings and pongs between them, then a close; and the
/// events it must give.
fn random_conversation(rng: &mut Rng, max_len: usize) -> (Vec<ClientFrame>, Vec<Event>) {
    let (mut frames, mut expected) = (Vec::new(), Vec::new());
    for _ in 0..rng.index(12) {
        let text = rng.chance(80);
        let message = random_payload(rng, text, max_len);
        let n_fragments = 1 + rng.index(4);
        let mut cuts: Vec<usize> = (1..n_fragments).map(|_| rng.index(message.len() + 1)).collect();
        cuts.sort_unstable();
        let bounds: Vec<usize> = std::iter::once(0).chain(cuts).chain([message.len()]).collect();
        for (i, pair) in bounds.windows(2).enumerate() {
            let opcode = match (i, text) {
                (0, true) => OpCode::Text,
                (0, false) => OpCode::Binary,
                _ => OpCode::Continuation,
            };
            let last = i == n_fragments - 1;
            frames.push(frame(last, opcode, &message[pair[0]..pair[1]]));
            if last {
                expected.push(if text { Event::Text(message.clone()) } else { Event::Binary });
            }
            // Control frames may come between a message's fragments (RFC 6455 §5.4).
            if rng.chance(20) {
                let payload = random_payload(rng, false, 125);
                expected.push(Event::Reply(OpCode::Pong as u8, payload.clone()));
                frames.push(frame(true, OpCode::Ping, &payload));
            } else if rng.chance(10) {
                frames.push(frame(true, OpCode::Pong, &random_payload(rng, false, 125)));
            }
        }
    }
    if rng.chance(90) {
        let mut close = rng.pick(&[1000u16, 1001, 1014, 3000, 4999]).to_be_bytes().to_vec();
        close.extend(random_payload(rng, true, 100));
        if rng.chance(10) {
            close.clear();
        }
        expected.push(Event::Reply(OpCode::Close as u8, close.clone()));
        frames.push(frame(true, OpCode::Close, &close));
    }
    expected.push(Event::Closed);
    (frames, expected)
}

#[test]
fn random_conversations_read_in_random_pieces_give_the_events_of_the_model() {
    for seed in 0..200 {
        let mut rng = Rng::new(seed);
        let read_size = *rng.pick(&[1, 2, 3, 7, 64, 1000, 1 << 17]);
        // Byte-sized reads of long messages would take long in a debug build.
        let max_len = if read_size < 64 { 3000 } else { *rng.pick(&[20, 3000, limits::MAX_INBOUND_FRAME_BYTES]) };
        let (frames, expected) = random_conversation(&mut rng, max_len);
        let events = read_through(frames, read_size);
        assert_eq!(events, expected, "seed {seed}, reads of up to {read_size} bytes");
    }
}

/// The events of `bytes` sent raw (a client that frames them itself).
fn read_raw(bytes: Vec<u8>) -> Vec<Event> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let (sender, mut receiver) = mpsc::channel(4);
        read_frames(std::io::Cursor::new(bytes), sender).await;
        let mut events = Vec::new();
        while let Ok(inbound) = receiver.try_recv() {
            events.push(event(inbound));
        }
        events
    })
}

/// A masked client frame with an all-zero key (so the payload reads as is):
/// `first` is the first byte (FIN, reserved bits, opcode).
fn raw_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let mut bytes = vec![first];
    match payload.len() {
        len if len < 126 => bytes.push(0x80 | len as u8),
        len if len <= usize::from(u16::MAX) => {
            bytes.push(0x80 | 126);
            bytes.extend((len as u16).to_be_bytes());
        }
        len => {
            bytes.push(0x80 | 127);
            bytes.extend((len as u64).to_be_bytes());
        }
    }
    bytes.extend([0; 4]);
    bytes.extend(payload);
    bytes
}

const TEXT: u8 = 0x81;

#[test]
fn a_text_frame_then_the_end_of_the_stream() {
    assert_eq!(read_raw(raw_frame(TEXT, b"{}")), [Event::Text(b"{}".to_vec()), Event::Closed]);
    // The stream ends inside a frame: closed, the partial frame dropped.
    let mut cut = raw_frame(TEXT, b"{\"op\":1}");
    cut.truncate(7);
    assert_eq!(read_raw(cut), [Event::Closed]);
}

#[test]
fn frames_the_protocol_forbids_close_with_1002() {
    let protocol_error = |bytes: Vec<u8>| {
        let events = read_raw(bytes);
        assert_eq!(events, [Event::Fatal(CLOSE_PROTOCOL_ERROR)]);
    };
    for reserved in [0x40, 0x20, 0x10] {
        protocol_error(raw_frame(TEXT | reserved, b"{}"));
    }
    for opcode in [0x3, 0x7, 0xB, 0xF] {
        protocol_error(raw_frame(0x80 | opcode, b""));
    }
    let mut unmasked = raw_frame(TEXT, b"{}");
    unmasked[1] &= 0x7F;
    unmasked.drain(2..6);
    protocol_error(unmasked);
    protocol_error(raw_frame(0x09, b"fragmented ping"));
    protocol_error(raw_frame(0x89, &[0; 126]));
    protocol_error(raw_frame(0x80, b"a continuation outside a message"));
    protocol_error([raw_frame(0x01, b"{"), raw_frame(TEXT, b"{}")].concat());
    // Close frames: a one-byte payload, codes no endpoint may send.
    protocol_error(raw_frame(0x88, &[3]));
    for code in [0u16, 999, 1004, 1005, 1006, 1015, 2000, 2999, 5000] {
        protocol_error(raw_frame(0x88, &code.to_be_bytes()));
    }
}

#[test]
fn text_that_is_not_utf8_closes_with_1007() {
    assert_eq!(read_raw(raw_frame(TEXT, &[b'"', 0xFF, b'"'])), [Event::Fatal(CLOSE_NOT_UTF8)]);
    // Valid only as a whole: a character cut between two fragments is fine.
    let euro = "€".as_bytes();
    let split = [raw_frame(0x01, &euro[..1]), raw_frame(0x80, &euro[1..])].concat();
    assert_eq!(read_raw(split), [Event::Text(euro.to_vec()), Event::Closed]);
    let cut_short = [raw_frame(0x01, &euro[..1]), raw_frame(0x80, b"")].concat();
    assert_eq!(read_raw(cut_short), [Event::Fatal(CLOSE_NOT_UTF8)]);
    let mut close = 1000u16.to_be_bytes().to_vec();
    close.push(0xFF);
    assert_eq!(read_raw(raw_frame(0x88, &close)), [Event::Fatal(CLOSE_NOT_UTF8)]);
}

#[test]
fn a_message_over_the_limit_closes_with_1009_before_its_payload_is_read() {
    let max = limits::MAX_INBOUND_FRAME_BYTES;
    // The header alone says too much: no payload follows in the stream.
    let mut header = raw_frame(TEXT, b"");
    header[1] = 0x80 | 127;
    header.splice(2..2, ((max + 1) as u64).to_be_bytes());
    assert_eq!(read_raw(header), [Event::Fatal(CLOSE_TOO_BIG)]);
    let mut huge = raw_frame(TEXT, b"");
    huge[1] = 0x80 | 127;
    huge.splice(2..2, u64::MAX.to_be_bytes());
    assert_eq!(read_raw(huge), [Event::Fatal(CLOSE_TOO_BIG)]);
    // Fragments each within the limit, together over it.
    let half = vec![b'a'; max / 2 + 1];
    let fragments = [raw_frame(0x01, &half), raw_frame(0x80, &half)].concat();
    assert_eq!(read_raw(fragments), [Event::Fatal(CLOSE_TOO_BIG)]);
    // Exactly the limit is fine.
    let whole = vec![b'a'; max];
    assert_eq!(read_raw(raw_frame(TEXT, &whole)), [Event::Text(whole), Event::Closed]);
}

#[test]
fn the_buffer_goes_back_to_its_retained_size_after_a_large_frame() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let large = vec![b'x'; 40_000];
        let mut stream = std::io::Cursor::new([raw_frame(TEXT, &large), raw_frame(TEXT, b"{}")].concat());
        let mut reader = FrameReader::default();
        let [first, _] = reader.next_events(&mut stream).await;
        assert!(matches!(first, Some(Inbound::Text(text)) if text == large));
        // The next frame was read with the large one, so the buffer is not empty yet.
        let [second, _] = reader.next_events(&mut stream).await;
        assert!(matches!(second, Some(Inbound::Text(text)) if text == b"{}"));
        assert!(reader.buffer.capacity() <= RETAINED_READ_BYTES, "kept {}", reader.buffer.capacity());
    });
}
