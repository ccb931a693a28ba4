//! The lab's commands, one file each, offered by the same `settled` binary
//! beside the product's: `bench`, `bench-worker`, `bench-queue-worker`,
//! `chaos`, `provider-sim`, `lab` (`lab harness-adapter`, `lab pgbench-script`), and
//! `lab-worker` (the product's worker with the lab's simulated work).

pub mod bench;
pub mod bench_queue_worker;
pub mod bench_worker;
pub mod chaos;
pub mod lab;
pub mod lab_worker;
pub mod provider_sim;
