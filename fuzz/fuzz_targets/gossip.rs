//! libFuzzer target `gossip`: see `floodgate_fuzz::bodies::gossip` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::gossip(data);
});
