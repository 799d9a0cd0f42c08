//! Writes to Constellation's objects (and the autoscaler Deployment), as
//! untyped JSON: the replacement feature watches them untyped, and typed
//! Deployments would cost binary size for two fields.

use crate::api::node::Node;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::FIELD_MANAGER;
use crate::api::constellation::Kind;
use crate::decide::Outcome;
use crate::error::{Error, Result};

/// How the cluster role is granted Job create (`deploy::Elevated::Jobs`).
pub const JOBS_GRANT: &str = "`manifests --upgrade-jobs` (Helm `cluster.upgradeJobs`)";
/// How it is granted node delete and Deployment patch
/// (`deploy::Elevated::Replacement`).
pub const REPLACEMENT_GRANT: &str = "`manifests --replacement` (Helm: a `cluster.providerCommand`)";

/// What a refusal of a grant given only with a feature's switch means:
/// "(… is granted only with …)", or nothing for any other error.
pub fn ungranted(e: &kube::Error, asked_by: &str) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            format!(" (nodekeeper's cluster identity is granted this only with {asked_by})")
        }
        _ => String::new(),
    }
}

fn api(client: &Client, kind: Kind, namespace: Option<&str>) -> Api<DynamicObject> {
    let ar = kind.resource();
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn written(kind: Kind, o: &DynamicObject) -> Outcome {
    Outcome::ObjectWritten {
        kind,
        name: o.name_any(),
        resource_version: o.resource_version(),
    }
}

pub async fn create(client: &Client, kind: Kind, object: &Value) -> Result<Outcome> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ns = object["metadata"]["namespace"].as_str();
    let obj: DynamicObject = serde_json::from_value(object.clone())
        .map_err(|e| Error::Invalid(format!("{} {name}: {e}", kind.name())))?;
    match api(client, kind, ns)
        .create(&PostParams::default(), &obj)
        .await
    {
        Ok(o) => Ok(written(kind, &o)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Outcome::Done),
        Err(e) => Err(Error::kube(format!("creating {} {name}", kind.name()))(e)),
    }
}

pub async fn patch(
    client: &Client,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
    body: &Value,
    status: bool,
    strategic: bool,
) -> Result<Outcome> {
    let api = api(client, kind, namespace);
    let pp = PatchParams::default();
    let res = match (strategic, status) {
        (true, _) => api.patch(name, &pp, &Patch::Strategic(body)).await,
        (false, true) => api.patch_status(name, &pp, &Patch::Merge(body)).await,
        (false, false) => api.patch(name, &pp, &Patch::Merge(body)).await,
    };
    match res {
        Ok(o) => Ok(written(kind, &o)),
        // Gone: nothing left to patch; the next round sees it gone.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Outcome::Done),
        Err(e) => Err(Error::kube(format!(
            "patching {} {name}{}",
            kind.name(),
            if kind == Kind::Deployment {
                ungranted(&e, REPLACEMENT_GRANT)
            } else {
                String::new()
            }
        ))(e)),
    }
}

pub async fn write_status(
    client: &Client,
    kind: Kind,
    name: &str,
    resource_version: &Option<String>,
    status: &Value,
) -> Result<Outcome> {
    let ar = kind.resource();
    let mut body = json!({
        "apiVersion": ar.api_version,
        "kind": ar.kind,
        "metadata": { "name": name },
        "status": status,
    });
    // An apply with a null resourceVersion is refused; none means unguarded.
    if let Some(rv) = resource_version {
        body["metadata"]["resourceVersion"] = json!(rv);
    }
    match api(client, kind, None)
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(o) => Ok(written(kind, &o)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Outcome::Done),
        Err(e) => Err(Error::kube(format!(
            "writing status of {} {name}",
            kind.name()
        ))(e)),
    }
}

fn only(uid: Option<&str>) -> DeleteParams {
    DeleteParams {
        preconditions: uid.map(|u| Preconditions {
            uid: Some(u.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    }
}

pub async fn delete(client: &Client, kind: Kind, name: &str, uid: Option<&str>) -> Result<Outcome> {
    match api(client, kind, None).delete(name, &only(uid)).await {
        Ok(_) => Ok(Outcome::Done),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Outcome::Done),
        Err(e) => Err(Error::kube(format!("deleting {} {name}", kind.name()))(e)),
    }
}

pub async fn delete_node(client: &Client, name: &str, uid: Option<&str>) -> Result<Outcome> {
    let api: Api<Node> = Api::all(client.clone());
    match api.delete(name, &only(uid)).await {
        Ok(_) => Ok(Outcome::Done),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Outcome::Done),
        Err(e) => Err(Error::kube(format!(
            "deleting node {name}{}",
            ungranted(&e, REPLACEMENT_GRANT)
        ))(e)),
    }
}
