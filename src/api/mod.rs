//! The APIs nodekeeper serves, as Rust types from which the CRDs are
//! generated (`nodekeeper crds`): one file per API family, and [`common`]
//! for the building blocks every feature shares. Validation that needs no
//! other object lives in the schema (OpenAPI and CEL), so the API server
//! refuses bad objects with a clear message.

/// `k8s_openapi`'s type traits for a slim core/v1 kind of ours ([`pod`],
/// [`node`]), from which kube's `Resource` follows: its kind, URL path
/// segment and scope, and the metadata it carries.
macro_rules! core_v1_kind {
    ($t:ty, $kind:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $t {
            const API_VERSION: &'static str = "v1";
            const GROUP: &'static str = "";
            const KIND: &'static str = $kind;
            const VERSION: &'static str = "v1";
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::Metadata for $t {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }
    };
}

pub mod common;
pub mod constellation;
pub mod drain_rule;
pub mod mutex;
pub mod node;
pub mod nodemaintenance;
pub mod pod;
pub mod reboot;
pub mod upgrade;

/// Every CRD nodekeeper serves, in install order: the output of [`crds`],
/// checked in as compact JSON (`crds.json`), embedded deflated (build.rs)
/// and printed as YAML by [`crate::yaml`] ([`crds_yaml`]). Generating them
/// at run time would link schemars and every type's schema code (~250 KiB
/// of an 8 MiB budget) for one subcommand; embedding the YAML instead of
/// JSON cost 44 KB more, and the JSON itself 96 KB more than deflated. A
/// unit test fails when the file is stale.
const CRDS: Embedded = embedded!("crds.json");

/// A checked-in CRD file as the binary carries it: deflated by build.rs.
pub(crate) struct Embedded {
    /// The file's name under `src/api`, for an error.
    file: &'static str,
    deflated: &'static [u8],
}

/// The [`Embedded`] form of a checked-in CRD file of `src/api`.
macro_rules! embedded {
    ($file:literal) => {
        $crate::api::Embedded {
            file: $file,
            deflated: include_bytes!(concat!(env!("OUT_DIR"), "/", $file, ".deflate")),
        }
    };
}
pub(crate) use embedded;

/// The CRDs of `crds.json` as YAML documents, for `kubectl apply`.
pub fn crds_yaml() -> crate::error::Result<String> {
    as_yaml(&CRDS)
}

/// Checked-in compact JSON (a list of documents) as YAML documents.
pub(crate) fn as_yaml(crds: &Embedded) -> crate::error::Result<String> {
    Ok(crate::yaml::documents(&documents(crds)?))
}

/// The documents of an embedded CRD file.
fn documents(crds: &Embedded) -> crate::error::Result<Vec<serde_json::Value>> {
    let bad = |why: String| {
        crate::error::Error::Invalid(format!("the embedded {} is damaged: {why}", crds.file))
    };
    let json = miniz_oxide::inflate::decompress_to_vec(crds.deflated)
        .map_err(|e| bad(format!("{e:?}")))?;
    serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))
}

/// Every CRD nodekeeper serves, generated from the types (tests only; see
/// [`CRDS`]).
#[cfg(test)]
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        nodemaintenance::NodeMaintenance::crd(),
        reboot::RebootPolicy::crd(),
        upgrade::UpgradePlan::crd(),
        drain_rule::DrainRule::crd(),
    ]
}

/// Compare generated CRDs with their checked-in compact JSON, as the
/// binary embeds it (so the deflated bytes are proven to inflate back to
/// the file); with `NODEKEEPER_REGENERATE=1`, write the file instead.
#[cfg(test)]
pub(crate) fn check_generated(
    crds: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
    embedded: &Embedded,
) {
    let file = format!("src/api/{}", embedded.file);
    let inflated = miniz_oxide::inflate::decompress_to_vec(embedded.deflated).unwrap_or_default();
    let checked_in = String::from_utf8_lossy(&inflated);
    let docs: Vec<serde_json::Value> = crds
        .iter()
        .map(|c| {
            let mut v = serde_json::to_value(c).unwrap_or_default();
            harden_selectors(&mut v);
            v
        })
        .collect();
    let generated = format!("{}\n", serde_json::Value::Array(docs));
    if std::env::var_os("NODEKEEPER_REGENERATE").is_some() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(&file);
        std::fs::write(&path, &generated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    assert!(
        generated == checked_in,
        "{file} is stale; regenerate with: NODEKEEPER_REGENERATE=1 cargo test --lib checked_in_crds"
    );
}

/// Make the API server refuse what Kubernetes' own label selectors
/// refuse, in every selector of every CRD (k8s-openapi's schema for
/// `LabelSelector` leaves `operator` a free string): an operator other than
/// In, NotIn, Exists and DoesNotExist, In/NotIn without values, and
/// Exists/DoesNotExist with values. Without it `operator: Bogus` in a pod
/// selector was accepted and the policy reported itself valid. The bounds
/// keep each CEL rule's estimated cost small.
#[cfg(test)]
fn harden_selectors(v: &mut serde_json::Value) {
    use serde_json::{Value, json};
    let is_requirement = |items: &Value| {
        let props = &items["properties"];
        props.get("key").is_some()
            && props.get("operator").is_some()
            && props.get("values").is_some()
    };
    match v {
        Value::Object(map) => {
            if let Some(exprs) = map
                .get_mut("properties")
                .and_then(|p| p.get_mut("matchExpressions"))
                && is_requirement(&exprs["items"])
            {
                exprs["maxItems"] = json!(32);
                let items = &mut exprs["items"];
                items["properties"]["operator"]["enum"] =
                    json!(["In", "NotIn", "Exists", "DoesNotExist"]);
                items["properties"]["values"]["maxItems"] = json!(256);
                items["x-kubernetes-validations"] = json!([{
                    "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",
                    "message": "In and NotIn need values; Exists and DoesNotExist take none"
                }]);
            }
            for (_, child) in map.iter_mut() {
                harden_selectors(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(harden_selectors),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// Every field nodekeeper's own CRDs define carries a description, so
    /// `kubectl explain rebootpolicy.spec.budget` answers: the field-by-field
    /// reference lives in the schemas. (NodeMaintenance keeps medik8s's
    /// shape; the foreign kinds are theirs.) Types Kubernetes defines
    /// (label selectors, conditions) are described where they are used.
    #[test]
    fn every_field_of_every_crd_has_a_description() {
        fn walk(path: &str, schema: &Value, missing: &mut Vec<String>) {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                if let Some(items) = schema.get("items") {
                    walk(&format!("{path}[]"), items, missing);
                }
                return;
            };
            for (name, child) in props {
                let at = format!("{path}.{name}");
                let described = child
                    .get("description")
                    .and_then(Value::as_str)
                    .is_some_and(|d| !d.trim().is_empty());
                // Inside Kubernetes' own types (a selector's
                // matchExpressions, a condition's fields) k8s-openapi
                // describes what it describes.
                let kubernetes = path.contains(".matchExpressions")
                    || path.contains(".matchLabels")
                    || path.ends_with(".conditions[]")
                    || path.contains("Selector.")
                    || path.contains("selector.");
                if !described && !kubernetes {
                    missing.push(at.clone());
                }
                walk(&at, child, missing);
            }
        }
        let crds = super::documents(&super::CRDS).unwrap_or_default();
        let mut missing = Vec::new();
        for crd in &crds {
            let kind = crd["spec"]["names"]["kind"].as_str().unwrap_or_default();
            if kind == "NodeMaintenance" {
                continue;
            }
            for v in crd["spec"]["versions"].as_array().into_iter().flatten() {
                let schema = &v["schema"]["openAPIV3Schema"];
                for part in ["spec", "status"] {
                    walk(
                        &format!("{kind}.{part}"),
                        &schema["properties"][part],
                        &mut missing,
                    );
                }
            }
        }
        assert!(
            missing.is_empty(),
            "{} fields without a description:\n{}",
            missing.len(),
            missing.join("\n")
        );
    }

    #[test]
    fn every_embedded_crd_file_inflates_to_its_yaml_documents() {
        for (embedded, n) in [
            (&super::CRDS, super::crds().len()),
            (&super::mutex::CRDS, super::mutex::crds().len()),
            (
                &super::constellation::CRDS,
                super::constellation::crds().len(),
            ),
        ] {
            let yaml = super::as_yaml(embedded).unwrap_or_default();
            assert_eq!(
                yaml.matches("kind: CustomResourceDefinition").count(),
                n,
                "{}",
                embedded.file
            );
        }
        let damaged = super::Embedded {
            file: "crds.json",
            deflated: &super::CRDS.deflated[..100],
        };
        let err = super::as_yaml(&damaged).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("the embedded crds.json is damaged")),
            "{err:?}"
        );
    }

    #[test]
    fn checked_in_crds_match_the_types() {
        super::check_generated(super::crds(), &super::CRDS);
        super::check_generated(super::mutex::crds(), &super::mutex::CRDS);
    }
}
