//! One request to a node: a frame out on a fresh bidirectional stream, its answer back, matched
//! against the kind asked for ([`request`]); and how any answer frame is matched
//! ([`expect_answer`], which the check streams use for their long-lived streams too).

use floodgate::wire::{ErrorCode, Frame, FrameKind, FrameReader, decode_error_frame, encode_frame};
use rkyv::util::AlignedVec;

/// Why a request got no answer of the kind asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AnswerError {
    /// The node answered with an error frame.
    Refused { code: ErrorCode, message: String },
    /// No usable answer: the stream failed, the frame was bad, or it answered something else.
    Failed(String),
}

impl std::fmt::Display for AnswerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnswerError::Refused { code, message } => {
                write!(f, "the node refused: {message} ({code})")
            }
            AnswerError::Failed(why) => f.write_str(why),
        }
    }
}

impl From<AnswerError> for String {
    fn from(error: AnswerError) -> String {
        error.to_string()
    }
}

fn failed(why: impl std::fmt::Display) -> AnswerError {
    AnswerError::Failed(why.to_string())
}

/// The payload of `frame` if it answers request `request_id` with a frame of kind `expected`.
/// An error frame is the node refusing; id 0 is the node speaking about the whole stream (e.g.
/// shutting down), so it answers any request.
pub(crate) fn expect_answer(
    frame: Frame,
    expected: FrameKind,
    request_id: u64,
) -> Result<AlignedVec, AnswerError> {
    expect_frame(frame, expected, request_id).map(|frame| frame.payload)
}

/// As [`expect_answer`], the whole frame: for kinds whose layout depends on its version.
fn expect_frame(frame: Frame, expected: FrameKind, request_id: u64) -> Result<Frame, AnswerError> {
    if frame.request_id != request_id && frame.request_id != 0 {
        return Err(failed(format!(
            "answer to request {} while waiting for {request_id}",
            frame.request_id
        )));
    }
    match frame.kind {
        kind if kind == expected => Ok(frame),
        FrameKind::Error => {
            let error = decode_error_frame(&frame.payload).map_err(|(_, why)| failed(why))?;
            match ErrorCode::from_u16(error.code) {
                Some(code) => Err(AnswerError::Refused {
                    code,
                    message: error.message,
                }),
                None => Err(failed(format!(
                    "unknown error code {}: {}",
                    error.code, error.message
                ))),
            }
        }
        other => Err(failed(format!(
            "the node answered {other:?} where {expected:?} was expected"
        ))),
    }
}

/// Sends one `kind` frame with `payload` on a fresh stream of `conn`, finishes the stream (the
/// node answers, then finishes its side), and returns the payload of the answer if it is an
/// `expected` frame of at most `max_answer_bytes`.
pub(crate) async fn request(
    conn: &quinn::Connection,
    kind: FrameKind,
    payload: &[u8],
    expected: FrameKind,
    max_answer_bytes: usize,
) -> Result<AlignedVec, AnswerError> {
    request_frame(conn, kind, payload, expected, max_answer_bytes)
        .await
        .map(|frame| frame.payload)
}

/// As [`request`], the whole answer frame (its version says its payload's layout).
pub(crate) async fn request_frame(
    conn: &quinn::Connection,
    kind: FrameKind,
    payload: &[u8],
    expected: FrameKind,
    max_answer_bytes: usize,
) -> Result<Frame, AnswerError> {
    let mut frame = Vec::new();
    encode_frame(&mut frame, kind, REQUEST_ID, payload);
    request_encoded(conn, &frame, expected, max_answer_bytes).await
}

/// Each request has its own stream, so its id only has to be nonzero.
pub(crate) const REQUEST_ID: u64 = 1;

/// As [`request_frame`], for a frame already encoded (in the layout its version needs), with
/// request id [`REQUEST_ID`].
pub(crate) async fn request_encoded(
    conn: &quinn::Connection,
    frame: &[u8],
    expected: FrameKind,
    max_answer_bytes: usize,
) -> Result<Frame, AnswerError> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(failed)?;
    send.write_all(frame).await.map_err(failed)?;
    send.finish().map_err(failed)?;
    let bytes = recv.read_to_end(max_answer_bytes).await.map_err(failed)?;
    let mut reader = FrameReader::new(max_answer_bytes);
    reader.extend(&bytes);
    let frame = reader
        .next_frame()
        .map_err(|e| failed(format!("bad frame from the node: {e}")))?
        .ok_or_else(|| failed("the node finished the stream without an answer"))?;
    expect_frame(frame, expected, REQUEST_ID)
}

#[cfg(test)]
mod tests {
    use floodgate::wire::{ErrorFrame, encode_message};

    use super::*;

    fn frame(kind: FrameKind, request_id: u64, payload: &[u8]) -> Frame {
        let mut bytes = Vec::new();
        encode_frame(&mut bytes, kind, request_id, payload);
        read(&bytes)
    }

    fn read(bytes: &[u8]) -> Frame {
        let mut reader = FrameReader::new(1 << 16);
        reader.extend(bytes);
        reader.next_frame().unwrap().unwrap()
    }

    fn error(request_id: u64, code: u16) -> Frame {
        let mut bytes = Vec::new();
        let message = ErrorFrame {
            code,
            message: "no".to_owned(),
        };
        encode_message(&mut bytes, FrameKind::Error, request_id, &message);
        read(&bytes)
    }

    #[test]
    fn the_expected_kind_for_this_request_gives_its_payload() {
        let answer = expect_answer(
            frame(FrameKind::SlotTable, 7, b"abc"),
            FrameKind::SlotTable,
            7,
        );
        assert_eq!(answer.unwrap().as_slice(), b"abc");
    }

    #[test]
    fn an_error_frame_is_a_refusal_for_this_request_or_the_whole_stream() {
        let code = ErrorCode::StoreFull;
        for id in [7, 0] {
            let answer = expect_answer(error(id, code as u16), FrameKind::SlotTable, 7);
            assert_eq!(
                answer.unwrap_err(),
                AnswerError::Refused {
                    code,
                    message: "no".to_owned()
                }
            );
        }
        let unknown = expect_answer(error(7, u16::MAX), FrameKind::SlotTable, 7).unwrap_err();
        assert!(
            unknown.to_string().contains("unknown error code"),
            "{unknown}"
        );
    }

    #[test]
    fn another_kind_or_another_request_is_no_answer() {
        let kind = expect_answer(frame(FrameKind::Policy, 7, b""), FrameKind::SlotTable, 7);
        assert!(kind.unwrap_err().to_string().contains("Policy"));
        let other = expect_answer(frame(FrameKind::SlotTable, 8, b""), FrameKind::SlotTable, 7);
        assert!(other.unwrap_err().to_string().contains("request 8"));
    }
}
