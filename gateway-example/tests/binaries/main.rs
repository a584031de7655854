//! The tests that run the package's own binaries (`gateway-example`, `mock-upstream`), with the
//! in-process mock deployment next to its binary. They stay in this package, as one test binary,
//! because Cargo builds a package's binaries for, and gives their paths
//! (`CARGO_BIN_EXE_<name>`) to, that package's integration tests only. The in-process gateway
//! tests are in the workspace's `tests/gateway/`.

mod gateway;
mod keys;
mod mock_upstream;
