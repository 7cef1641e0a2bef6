//! storageversion-webhook: admission rules, lease view, admission server and garbage collector
//! for `internal.apiserver.k8s.io/v1alpha1` StorageVersion objects.

pub mod admission;
pub mod audit;
pub mod catalog;
pub mod check;
pub mod cli;
pub mod crd;
pub mod duration;
pub mod gc;
pub mod hooks;
pub mod kubeclient;
pub mod leader_task;
pub mod leases;
pub mod logging;
pub mod memory;
pub mod metadata;
pub mod metrics;
pub mod migrate;
pub mod model;
pub mod plugin;
pub mod report;
pub mod rules;
pub mod server;
pub mod state_map;
pub mod task;
