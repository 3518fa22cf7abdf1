//! One request on its own stream: open a bidirectional stream, write a frame, read the whole
//! answer, and take its frame of the kind expected. Every node-to-node request goes through it,
//! and tests that talk to a node use it too.

use floodgate::wire::{Frame, FrameKind, FrameReader};

/// Opens a bidirectional stream, writes `frame`, finishes the stream and reads every byte of
/// the answer (at most `max_bytes`) until the other end finishes it.
pub async fn round_trip(
    connection: &quinn::Connection,
    frame: &[u8],
    max_bytes: usize,
) -> anyhow::Result<Vec<u8>> {
    let (mut send, mut recv) = connection.open_bi().await?;
    send.write_all(frame).await?;
    send.finish()?;
    Ok(recv.read_to_end(max_bytes).await?)
}

/// The first frame of `answer`, when it is of `kind`; otherwise what came instead, in words.
pub fn frame_of_kind(answer: &[u8], kind: FrameKind) -> anyhow::Result<Frame> {
    let mut reader = FrameReader::new(answer.len().max(16));
    reader.extend(answer);
    match reader.next_frame() {
        Ok(Some(frame)) if frame.kind == kind => Ok(frame),
        Ok(Some(frame)) => anyhow::bail!("expected a {kind:?} frame, got a {:?}", frame.kind),
        Ok(None) => anyhow::bail!("expected a {kind:?} frame, got {} bytes", answer.len()),
        Err(e) => anyhow::bail!("expected a {kind:?} frame, got an unreadable answer: {e}"),
    }
}

/// [`round_trip`], then [`frame_of_kind`].
pub async fn request(
    connection: &quinn::Connection,
    frame: &[u8],
    max_bytes: usize,
    kind: FrameKind,
) -> anyhow::Result<Frame> {
    let answer = round_trip(connection, frame, max_bytes).await?;
    frame_of_kind(&answer, kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_frame_of_the_kind_asked_for_is_taken() {
        let mut bytes = Vec::new();
        floodgate::wire::encode_frame(&mut bytes, FrameKind::SlotTable, 7, b"payload");
        let frame = frame_of_kind(&bytes, FrameKind::SlotTable).unwrap();
        assert_eq!((frame.request_id, &frame.payload[..]), (7, &b"payload"[..]));
        let wrong = frame_of_kind(&bytes, FrameKind::DecisionBatch).unwrap_err();
        assert!(wrong.to_string().contains("got a SlotTable"), "{wrong}");
        assert!(frame_of_kind(&[], FrameKind::DecisionBatch).is_err());
        assert!(frame_of_kind(b"not a frame at all", FrameKind::DecisionBatch).is_err());
    }
}
