//! The APIs nodekeeper serves, as Rust types from which the CRDs are
//! generated (`nodekeeper crds`): one file per API family, and [`common`]
//! for the building blocks every feature shares. Validation that needs no
//! other object lives in the schema (OpenAPI and CEL), so the API server
//! refuses bad objects with a clear message.

pub mod common;
pub mod mutex;
pub mod nodemaintenance;
pub mod reboot;
pub mod upgrade;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Every CRD nodekeeper serves, in install order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    use kube::CustomResourceExt;
    vec![
        nodemaintenance::NodeMaintenance::crd(),
        reboot::RebootPolicy::crd(),
        upgrade::UpgradePlan::crd(),
    ]
}
