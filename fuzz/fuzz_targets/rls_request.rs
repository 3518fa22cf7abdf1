//! libFuzzer target `rls_request`: see `floodgate_fuzz::bodies::rls_request` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::rls_request(data);
});
