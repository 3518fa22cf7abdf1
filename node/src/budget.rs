//! The node-wide budget for bytes buffered from streams: every stream reserves what it holds from
//! one shared count, its partial frames and its answers not yet written (their room reserved
//! before a frame is answered), so all connections together buffer at most
//! `--max-buffered-bytes`.
//!
//! Accounting is one atomic update per read (not per frame) and per growth of an answer buffer,
//! and a reservation gives its bytes back when dropped, however its stream ends.

use std::sync::atomic::{AtomicUsize, Ordering};

use floodgate::wire::{ErrorCode, Frame, FrameError, FrameReader};

/// Most bytes read from a stream at once: what a stream may hold beyond one frame.
pub(crate) const READ_BYTES: usize = 64 * 1024;
/// A stream holding at most this much counts as small: small holdings (and peers' messages) may
/// use the whole budget, larger ones only seven eighths of it, so a flood of large partial frames
/// cannot starve the small frames that checks are, nor gossip.
const SMALL_BYTES: usize = 16 * 1024;

/// The shared count of buffered bytes.
#[derive(Debug)]
pub(crate) struct BufferBudget {
    limit: usize,
    used: AtomicUsize,
    /// The most ever held at once: tests and operators can see the bound held.
    peak: AtomicUsize,
}

impl BufferBudget {
    pub(crate) fn new(limit: usize) -> Self {
        BufferBudget {
            limit,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// A reservation holding nothing yet.
    pub(crate) fn reservation(&self) -> Reservation<'_> {
        Reservation {
            budget: self,
            held: 0,
        }
    }

    /// The most a holding of `bytes` may bring the total to.
    fn ceiling(&self, bytes: usize, privileged: bool) -> usize {
        if privileged || bytes <= SMALL_BYTES {
            self.limit
        } else {
            self.limit - self.limit / 8
        }
    }
}

/// Bytes one stream holds from the budget; given back on drop.
#[derive(Debug)]
pub(crate) struct Reservation<'a> {
    budget: &'a BufferBudget,
    held: usize,
}

/// The budget could not take a stream's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverBudget;

impl Reservation<'_> {
    /// Holds exactly `bytes` from now on. Shrinking always succeeds; growing fails (holding what
    /// it held) when the total would pass the ceiling for a holding of this size.
    pub(crate) fn resize(&mut self, bytes: usize, privileged: bool) -> Result<(), OverBudget> {
        let budget = self.budget;
        if bytes <= self.held {
            budget.used.fetch_sub(self.held - bytes, Ordering::Relaxed);
            self.held = bytes;
            return Ok(());
        }
        let grow = bytes - self.held;
        let ceiling = budget.ceiling(bytes, privileged);
        let before = budget
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(grow).filter(|total| *total <= ceiling)
            })
            .map_err(|_| OverBudget)?;
        budget.peak.fetch_max(before + grow, Ordering::Relaxed);
        self.held = bytes;
        Ok(())
    }

    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Holds exactly `bytes`, past the ceiling if need be: for bytes the node already holds and
    /// must count (an answer of checks already decided), so that other holdings see them.
    fn hold(&mut self, bytes: usize) {
        if bytes <= self.held {
            // Shrinking cannot fail.
            let _ = self.resize(bytes, false);
            return;
        }
        let budget = self.budget;
        let grow = bytes - self.held;
        let before = budget.used.fetch_add(grow, Ordering::Relaxed);
        budget.peak.fetch_max(before + grow, Ordering::Relaxed);
        self.held = bytes;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::Relaxed);
    }
}

/// The error a stream gets when the budget cannot take its bytes (it closes the stream).
pub(crate) fn overloaded(budget: &BufferBudget) -> FrameError {
    FrameError {
        code: ErrorCode::Overloaded,
        request_id: 0,
        message: format!(
            "the node is buffering too much for all its clients (limit {} bytes): send smaller \
             frames or retry later",
            budget.limit()
        ),
    }
}

/// A `FrameReader` whose buffered bytes are reserved from the budget before they are copied in.
#[derive(Debug)]
pub(crate) struct BudgetedReader<'a> {
    reader: FrameReader,
    reservation: Reservation<'a>,
    max_frame_bytes: usize,
}

impl<'a> BudgetedReader<'a> {
    pub(crate) fn new(budget: &'a BufferBudget, max_frame_bytes: usize) -> Self {
        BudgetedReader {
            reader: FrameReader::new(max_frame_bytes),
            reservation: budget.reservation(),
            max_frame_bytes,
        }
    }

    /// Appends received bytes, or refuses them (appending nothing) with `overloaded`.
    pub(crate) fn extend(&mut self, data: &[u8]) -> Result<(), FrameError> {
        let wanted = self.reader.buffered() + data.len();
        if self.reservation.resize(wanted, false).is_err() {
            return Err(overloaded(self.reservation.budget));
        }
        self.reader.extend(data);
        Ok(())
    }

    pub(crate) fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        self.reader.next_frame()
    }

    pub(crate) fn finish(&self) -> Result<(), FrameError> {
        self.reader.finish()
    }

    /// Call after taking every complete frame: holds only the partial frame left, and once the
    /// reader is empty after a large frame, lets its buffer go (a Vec keeps its capacity).
    pub(crate) fn settle(&mut self) {
        let left = self.reader.buffered();
        if left == 0 && self.reservation.held() > SMALL_BYTES {
            self.reader = FrameReader::new(self.max_frame_bytes);
        }
        // Shrinking cannot fail.
        let _ = self.reservation.resize(left, false);
    }
}

/// A stream's answers, held from when they are encoded until they are written, and counted in
/// the budget by the room their buffer takes: a small request can draw a large answer (the rules
/// text, up to 1 MiB, for a policy request of a few bytes), and a caller that stops reading keeps
/// it held until the write times out.
#[derive(Debug)]
pub(crate) struct BudgetedAnswers<'a> {
    bytes: Vec<u8>,
    reservation: Reservation<'a>,
    privileged: bool,
}

/// Whether the budget took an answer (see [`BudgetedAnswers::count`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    Fits,
    /// Counted past the budget: the answer decided something, so it is kept and written.
    Kept,
    /// Taken back: answering it changed nothing, and the budget could not take it.
    Undone,
}

impl<'a> BudgetedAnswers<'a> {
    /// Answers of a stream whose holdings may use the whole budget with `privileged` (a peer's).
    pub(crate) fn new(budget: &'a BufferBudget, privileged: bool) -> Self {
        BudgetedAnswers {
            bytes: Vec::new(),
            reservation: budget.reservation(),
            privileged,
        }
    }

    /// The buffer answers are encoded into; [`count`](Self::count) after each.
    pub(crate) fn out(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Makes room for `extra` more bytes of answers, reserved from the budget before they are
    /// encoded; false, changing nothing, when the budget cannot take it. The room doubles, as a
    /// vector's does, or grows to what is needed when the budget cannot take double.
    pub(crate) fn make_room(&mut self, extra: usize) -> bool {
        let room = self.bytes.capacity();
        let needed = self.bytes.len().saturating_add(extra);
        if needed <= room {
            return true;
        }
        let doubled = needed.max(room.saturating_mul(2));
        let target = if self.reservation.resize(doubled, self.privileged).is_ok() {
            doubled
        } else if self.reservation.resize(needed, self.privileged).is_ok() {
            needed
        } else {
            return false;
        };
        self.bytes.reserve_exact(target - self.bytes.len());
        // The allocator may give more than asked for: what the buffer holds is counted.
        self.reservation.hold(self.bytes.capacity());
        true
    }

    /// Counts the buffer after an answer was encoded from `before` (its length then). When the
    /// budget cannot take it, an `undoable` answer (a copy of state, that decided nothing) is
    /// taken back, the buffer given back to what was counted; any other (one that outgrew the
    /// room [`make_room`](Self::make_room) reserved for it) is kept, counted past the ceiling
    /// until written.
    pub(crate) fn count(&mut self, before: usize, undoable: bool) -> Counted {
        let room = self.bytes.capacity();
        // Most answers fit the room the buffer already had: no update of the shared count.
        if room <= self.reservation.held() {
            return Counted::Fits;
        }
        if self.reservation.resize(room, self.privileged).is_ok() {
            return Counted::Fits;
        }
        if undoable {
            self.bytes.truncate(before);
            self.bytes.shrink_to(self.reservation.held());
            self.reservation.hold(self.bytes.capacity());
            return Counted::Undone;
        }
        self.reservation.hold(room);
        Counted::Kept
    }

    /// After the answers were written: empties the buffer, keeping its room for the next answers
    /// unless that is more than `keep` bytes (idle streams would each hold a rare large answer's
    /// room for good), or more than a small holding while the budget is over half used (the
    /// room idle streams keep would crowd out the frames of busy ones), and counts what it keeps.
    pub(crate) fn written(&mut self, keep: usize) {
        self.bytes.clear();
        let room = self.bytes.capacity();
        let budget = self.reservation.budget;
        if room > keep || (room > SMALL_BYTES && budget.used() > budget.limit() / 2) {
            self.bytes = Vec::new();
        }
        // Shrinking cannot fail.
        let _ = self
            .reservation
            .resize(self.bytes.capacity(), self.privileged);
    }
}

/// Reads a whole one-way message of at most `readable` bytes (counting `header`, the bytes
/// already read from it) into a reader of frames up to `max_frame_bytes`, reserving its bytes
/// from the budget as they arrive. `Err(None)` when the stream failed or was longer than
/// `readable`, `Err(Some(_))` when it did not fit the budget.
pub(crate) async fn read_message<'a>(
    recv: &mut quinn::RecvStream,
    header: &[u8],
    max_frame_bytes: usize,
    readable: usize,
    budget: &'a BufferBudget,
    privileged: bool,
) -> Result<(FrameReader, Reservation<'a>), Option<OverBudget>> {
    let mut reservation = budget.reservation();
    let mut reader = FrameReader::new(max_frame_bytes);
    if header.len() > readable {
        return Err(None);
    }
    reservation.resize(header.len(), privileged).map_err(Some)?;
    reader.extend(header);
    while let Some(chunk) = recv.read_chunk(READ_BYTES, true).await.map_err(|_| None)? {
        let total = reader.buffered() + chunk.bytes.len();
        if total > readable {
            return Err(None);
        }
        reservation.resize(total, privileged).map_err(Some)?;
        reader.extend(&chunk.bytes);
    }
    Ok((reader, reservation))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_never_pass_the_limit_and_give_back_on_drop() {
        let budget = BufferBudget::new(64 * 1024);
        let mut a = budget.reservation();
        let mut b = budget.reservation();
        // Large holdings stop at seven eighths: 56 KiB.
        assert_eq!(a.resize(40 * 1024, false), Ok(()));
        assert_eq!(b.resize(20 * 1024, false), Err(OverBudget));
        assert_eq!(b.held(), 0);
        // A small holding may use the rest, up to the limit.
        assert_eq!(b.resize(16 * 1024, false), Ok(()));
        let mut c = budget.reservation();
        assert_eq!(c.resize(9 * 1024, false), Err(OverBudget));
        assert_eq!(c.resize(8 * 1024, true), Ok(()));
        assert_eq!(budget.used(), 64 * 1024);
        assert_eq!(c.resize(1, true), Ok(()));
        assert_eq!(budget.used(), 56 * 1024 + 1);
        drop(a);
        drop(c);
        assert_eq!(budget.used(), 16 * 1024);
        drop(b);
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.peak(), 64 * 1024);
    }

    #[test]
    fn room_for_answers_is_reserved_before_they_are_encoded() {
        let budget = BufferBudget::new(64 * 1024);
        let mut reader = budget.reservation();
        assert_eq!(reader.resize(40 * 1024, false), Ok(()));
        let mut answers = BudgetedAnswers::new(&budget, false);
        assert!(answers.make_room(8 * 1024));
        answers.out().extend_from_slice(&[1; 8 * 1024]);
        assert_eq!(answers.count(0, false), Counted::Fits);
        assert_eq!(budget.used(), 40 * 1024 + answers.out().capacity());
        // Doubled where the budget takes it: 16 KiB, a small holding, up to the whole limit.
        assert!(answers.make_room(4 * 1024));
        assert!(answers.out().capacity() >= 16 * 1024);
        assert_eq!(budget.used(), 40 * 1024 + answers.out().capacity());
        // 24 KiB would be a large holding past seven eighths: refused, nothing changed.
        let (room, used) = (answers.out().capacity(), budget.used());
        assert!(!answers.make_room(16 * 1024));
        assert_eq!((answers.out().capacity(), budget.used()), (room, used));
        // Within the room already held, nothing is asked of the budget.
        assert!(answers.make_room(room - answers.len()));
        assert_eq!(budget.used(), used);
        // Less pressing on the budget, the same room is granted: only what is needed when
        // double does not fit (24 KiB; 32 KiB would pass seven eighths).
        assert_eq!(reader.resize(32 * 1024, false), Ok(()));
        assert!(answers.make_room(16 * 1024));
        let room = answers.out().capacity();
        assert!((24 * 1024..32 * 1024).contains(&room), "{room}");
        assert_eq!(budget.used(), 32 * 1024 + room);
        drop(answers);
        drop(reader);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn answers_are_counted_by_their_room_and_undone_or_kept_past_the_budget() {
        let budget = BufferBudget::new(64 * 1024);
        let mut reader = budget.reservation();
        assert_eq!(reader.resize(40 * 1024, false), Ok(()));
        let mut answers = BudgetedAnswers::new(&budget, false);
        answers.out().extend_from_slice(&[1; 8 * 1024]);
        assert_eq!(answers.count(0, true), Counted::Fits);
        let room = answers.out().capacity();
        assert_eq!(budget.used(), 40 * 1024 + room);
        // A copy that would pass seven eighths is taken back, the room to what was counted.
        let before = answers.len();
        answers.out().extend_from_slice(&[2; 16 * 1024]);
        assert_eq!(answers.count(before, true), Counted::Undone);
        assert_eq!(answers.bytes(), &[1; 8 * 1024][..]);
        assert_eq!(budget.used(), 40 * 1024 + answers.out().capacity());
        assert!(budget.used() <= 64 * 1024);
        // An answer that decided something is kept and counted, past the ceiling.
        answers.out().extend_from_slice(&[3; 16 * 1024]);
        assert_eq!(answers.count(before, false), Counted::Kept);
        assert_eq!(answers.len(), 24 * 1024);
        assert_eq!(budget.used(), 40 * 1024 + answers.out().capacity());
        assert!(budget.used() > 56 * 1024);
        // Nothing else grows meanwhile, a small holding neither.
        let mut small = budget.reservation();
        assert_eq!(small.resize(16 * 1024, false), Err(OverBudget));
        // Written: room past `keep` is let go; room within it is kept, and counted.
        answers.written(32 * 1024);
        assert_eq!(answers.out().capacity(), 0);
        assert_eq!(budget.used(), 40 * 1024);
        answers.out().extend_from_slice(&[4; 100]);
        assert_eq!(answers.count(0, false), Counted::Fits);
        answers.written(32 * 1024);
        assert!(answers.out().capacity() >= 100);
        assert_eq!(budget.used(), 40 * 1024 + answers.out().capacity());
        drop(answers);
        assert_eq!(budget.used(), 40 * 1024);
        // More than a small holding's room is kept only while the budget is under half used.
        assert_eq!(reader.resize(24 * 1024, false), Ok(()));
        let mut answers = BudgetedAnswers::new(&budget, false);
        answers.out().extend_from_slice(&[5; 20 * 1024]);
        assert_eq!(answers.count(0, false), Counted::Fits);
        answers.written(32 * 1024);
        assert_eq!(
            answers.out().capacity(),
            0,
            "kept with the budget over half used"
        );
        drop(reader);
        answers.out().extend_from_slice(&[5; 20 * 1024]);
        assert_eq!(answers.count(0, false), Counted::Fits);
        answers.written(32 * 1024);
        assert!(
            answers.out().capacity() >= 20 * 1024,
            "let go with the budget under half used"
        );
        drop(answers);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_reader_over_budget_is_refused_with_overloaded_and_settles_to_what_it_holds() {
        let budget = BufferBudget::new(128 * 1024);
        let mut hog = BudgetedReader::new(&budget, 1 << 20);
        let mut header = Vec::new();
        floodgate::wire::encode_frame(
            &mut header,
            floodgate::wire::FrameKind::CheckBatch,
            1,
            &[0; 200 * 1024],
        );
        assert!(hog.extend(&header[..100 * 1024]).is_ok());
        assert!(matches!(hog.next_frame(), Ok(None)));
        hog.settle();
        assert_eq!(budget.used(), 100 * 1024);
        let refused = hog.extend(&header[100 * 1024..120 * 1024]).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Overloaded);
        assert_eq!(budget.used(), 100 * 1024);
        // A small frame on another stream still fits.
        let mut small = BudgetedReader::new(&budget, 1 << 20);
        let mut frame = Vec::new();
        floodgate::wire::encode_frame(&mut frame, floodgate::wire::FrameKind::TableRequest, 2, &[]);
        assert!(small.extend(&frame).is_ok());
        assert_eq!(small.next_frame().unwrap().unwrap().request_id, 2);
        small.settle();
        drop(hog);
        assert_eq!(budget.used(), 0);
    }
}
