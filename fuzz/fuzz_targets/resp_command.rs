//! libFuzzer target `resp_command`: see `floodgate_fuzz::bodies::resp_command` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::resp_command(data);
});
