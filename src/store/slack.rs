//! Giving back the room tables keep after mass removals. A bucket is charged its share of a
//! table at the lowest load the table has after it grew (`budget.rs`); a table never shrinks by
//! itself, so once evictions or expiry thin it, its memory would outgrow what its remaining
//! buckets are charged (a flood of one family evicted for another would hold both). After
//! every eviction pass, and once the expiry sweep has walked a shard, a table holding more
//! than its buckets' charge plus [`TABLE_SLACK_BYTES`] is rebuilt to fit them.

use super::budget::{GCRA_BUCKET_BYTES, LOG_BUCKET_BYTES, WINDOW_BUCKET_BYTES};
use super::shard::Shard;
use super::table::{Keyed, KeyedTable};

/// Most a table may hold beyond its buckets' charge before it is shrunk: above the rounding of
/// a table rebuilt to fit (a power of two of slots), so a rebuild is not repeated at once. Three
/// tables a shard: part of the node's fixed overhead, not of its budget.
pub const TABLE_SLACK_BYTES: usize = 4 << 10;

impl Shard {
    /// Shrinks every table holding more than its buckets are charged.
    pub(super) fn give_back_slack(&mut self) {
        shrink(&mut self.gcra, GCRA_BUCKET_BYTES);
        shrink(&mut self.windows, WINDOW_BUCKET_BYTES);
        // A log is charged its times besides its slot; the slots alone are compared here.
        shrink(&mut self.logs, LOG_BUCKET_BYTES);
    }
}

fn shrink<E: Keyed + Default>(table: &mut KeyedTable<E>, charge: usize) {
    if table.allocation_size() > table.len() * charge + TABLE_SLACK_BYTES {
        table.shrink_to_fit();
    }
}
