//! `SlotTable::from_reported`: a table as a node reports it (node list and per-slot indices)
//! is the table the nodes computed, whatever order and extra members the report lists.

use floodgate::cluster::{SLOTS, SlotTable};

fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

/// What a node sends for `table`: `listed` (every member it knows, in any order) and, per slot,
/// the index there of the owner and the successor.
fn report(table: &SlotTable, listed: &[String]) -> (Vec<u16>, Vec<u16>) {
    let index = |id: Option<&str>| {
        id.map_or(u16::MAX, |id| {
            listed.iter().position(|l| l == id).unwrap() as u16
        })
    };
    let slots = 0..SLOTS as u16;
    (
        slots.clone().map(|s| index(table.owner(s))).collect(),
        slots.map(|s| index(table.successor(s))).collect(),
    )
}

#[test]
fn a_reported_table_is_the_computed_one() {
    let computed = SlotTable::compute(7, &ids(&["node-b", "node-a", "node-c"]));
    // Listed out of order, with a member that owns nothing (a dead one).
    let listed = ids(&["node-c", "node-dead", "node-a", "node-b"]);
    let (owner, successor) = report(&computed, &listed);
    let reported =
        SlotTable::from_reported(7, computed.version(), &listed, &owner, &successor).unwrap();
    assert_eq!(reported, computed);
    assert!(!reported.contains("node-dead"));
}

#[test]
fn a_bad_report_is_refused_in_words() {
    let listed = ids(&["a", "b"]);
    let short = SlotTable::from_reported(1, 1, &listed, &[0; 10], &[1; 10]).unwrap_err();
    assert!(short.contains("expected 4096"), "{short}");
    let mut owner = vec![0u16; SLOTS];
    owner[5] = 2;
    let outside = SlotTable::from_reported(1, 1, &listed, &owner, &vec![1; SLOTS]).unwrap_err();
    assert!(outside.contains("node 2 of the 2"), "{outside}");
    let twice = ids(&["a", "a"]);
    let dup = SlotTable::from_reported(1, 1, &twice, &vec![0; SLOTS], &vec![1; SLOTS]).unwrap_err();
    assert!(dup.contains("names a twice"), "{dup}");
}
