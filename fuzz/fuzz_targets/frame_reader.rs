//! libFuzzer target `frame_reader`: see `floodgate_fuzz::bodies::frame_reader` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::frame_reader(data);
});
