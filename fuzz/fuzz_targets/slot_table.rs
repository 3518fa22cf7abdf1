//! libFuzzer target `slot_table`: see `floodgate_fuzz::bodies::slot_table` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::slot_table(data);
});
