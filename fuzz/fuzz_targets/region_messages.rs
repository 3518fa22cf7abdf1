//! libFuzzer target `region_messages`: see `floodgate_fuzz::bodies::region_messages` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::region_messages(data);
});
