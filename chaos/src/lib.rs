//! floodgate-chaos: real `floodgate-node` processes behind UDP fault proxies, driven through
//! the real client while a scenario injects faults, and checked against the documented
//! failure model.
//!
//! - `scenario`: the catalogue and each scenario's over-admission bound.
//! - `world`: the nodes, their proxies, the fault table and the gateways of one run.
//! - `procs`: node processes (start, kill, pause, stop); `proxy` and `faults`: the UDP fault
//!   proxy and the rules it applies; `sockets`: which ports a gateway sends from.
//! - `load`: gateways driving known keys, recording every decision; `keys`: those keys;
//!   `rules`: the rules file `rules-reload` edits and `rolling-upgrade` serves; `hostile`: the
//!   hostile client; `gateway_procs`: example-gateway processes driven over HTTP (`http`).
//! - `timeline`: what each scenario does, when; `run`: one scenario end to end.
//! - `checker`: the invariants (`bounds`: the documented bound of global keys;
//!   `region_upgrade`: the exchange across builds); `report` and `svg`: the outputs.
//! - `sim`: the core's seeded simulations (ownership, regions), many seeds at once.

pub mod bounds;
pub mod checker;
pub mod faults;
pub mod gateway_procs;
pub mod hostile;
pub mod http;
pub mod keys;
pub mod load;
pub mod procs;
pub mod proxy;
pub mod region_upgrade;
pub mod report;
pub mod rules;
pub mod run;
pub mod scenario;
pub mod sim;
pub mod sockets;
pub mod svg;
pub mod timeline;
pub mod world;

/// The core under test, re-exported.
pub use floodgate as core;
