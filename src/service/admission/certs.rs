//! The webhook's certificates: a CA and the serving certificate it signs
//! (generated in memory), keeping our CA in the configuration's caBundle
//! beside other instances', and rotating both after two thirds of their
//! life.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use smol::stream::StreamExt;

use super::{CONFIGURATION, Config, State, lock};
use crate::decide::admission::{self, OWNERS_ANNOTATION, Owned};
use crate::error::{Error, Result};

/// After publishing a new CA, how long the API servers get to load it
/// before we serve with the certificate it signed.
const PROPAGATION: Duration = Duration::from_secs(60);

/// A CA and the serving certificate it signed.
pub(super) struct Issued {
    pub(super) ca_pem: String,
    pub(super) owned: Owned,
    pub(super) tls: Arc<rustls::ServerConfig>,
    pub(super) not_before: Timestamp,
    pub(super) not_after: Timestamp,
}

fn sha256_hex(s: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, s.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn to_time(t: Timestamp) -> Result<time::OffsetDateTime> {
    time::OffsetDateTime::from_unix_timestamp(t.as_second())
        .map_err(|e| Error::Invalid(format!("certificate validity {t}: {e}")))
}

/// Generate a CA (ECDSA P-256, path length 0) and a serving certificate
/// for loopback and `config`'s names, valid from a minute ago (clock skew
/// between API server and us) for [`admission::CERT_LIFETIME`].
pub(super) fn issue(config: &Config, now: Timestamp) -> Result<Issued> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose, SanType,
    };
    let fail = |what: &str| {
        let what = what.to_string();
        move |e: rcgen::Error| Error::Invalid(format!("admission certificate: {what}: {e}"))
    };
    let not_before = now
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(60))
        .unwrap_or(now);
    let not_after = now
        .checked_add(admission::CERT_LIFETIME)
        .map_err(|e| Error::Invalid(format!("certificate validity: {e}")))?;

    let ca_key = KeyPair::generate().map_err(fail("generating the CA key"))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(fail("CA parameters"))?;
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("nodekeeper admission CA ({})", config.identity),
    );
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = to_time(not_before)?;
    ca.not_after = to_time(not_after)?;
    let ca_cert = ca.self_signed(&ca_key).map_err(fail("signing the CA"))?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(fail("generating the serving key"))?;
    let mut leaf = CertificateParams::new(config.names()).map_err(fail("serving names"))?;
    leaf.distinguished_name
        .push(DnType::CommonName, "nodekeeper admission");
    leaf.subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    leaf.subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()));
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = to_time(not_before)?;
    leaf.not_after = to_time(not_after)?;
    let cert = leaf
        .signed_by(&key, &issuer)
        .map_err(fail("signing the serving certificate"))?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls_error =
        |e: &dyn std::fmt::Display| Error::Invalid(format!("admission TLS configuration: {e}"));
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(&e))?;
    // Only the API server, by its webhook client certificate, unless on
    // loopback (see Config::parse).
    let builder = match &config.client_ca {
        None => builder.with_no_client_auth(),
        Some(cas) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in cas {
                roots.add(ca.clone()).map_err(|e| tls_error(&e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| tls_error(&e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut tls = builder
        .with_single_cert(
            vec![cert.der().clone(), ca_cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .map_err(|e| tls_error(&e))?;
    // HTTP/1.1 only: our server speaks nothing else.
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let ca_pem = ca_cert.pem();
    Ok(Issued {
        owned: Owned {
            identity: config.identity.clone(),
            sha256: sha256_hex(&format!("{}\n", ca_pem.trim())),
            not_after,
        },
        ca_pem,
        tls: Arc::new(tls),
        not_before,
        not_after,
    })
}

/// Keep our CA in the configuration's caBundle: on every change of the
/// object (ours, another instance's, an `apply` that reset it) and when
/// our CAs change. Level-triggered: each pass compares and writes only a
/// difference, guarded by the resourceVersion it read.
pub(super) async fn publish(state: Arc<State>, kicked: smol::channel::Receiver<()>) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(state.client.clone());
    let watch = watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={CONFIGURATION}")),
    );
    enum Wake {
        Seen(Option<Box<ValidatingWebhookConfiguration>>),
        Kicked,
        Listed,
    }
    let events = watch.filter_map(|ev| match ev {
        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
            Some(Wake::Seen(Some(Box::new(o))))
        }
        Ok(watcher::Event::Delete(_)) => Some(Wake::Seen(None)),
        Ok(watcher::Event::InitDone) => Some(Wake::Listed),
        Ok(watcher::Event::Init) => None,
        Err(e) => {
            log::debug!(
                "admission: watch of ValidatingWebhookConfiguration {CONFIGURATION}: {e} (retrying)"
            );
            None
        }
    });
    let kicks = kicked.map(|_| Wake::Kicked);
    let mut wakes = Box::pin(smol::stream::race(events, kicks));
    let mut last: Option<Box<ValidatingWebhookConfiguration>> = None;
    let mut warned = false;
    while let Some(wake) = wakes.next().await {
        match wake {
            Wake::Seen(o) => last = o,
            Wake::Kicked => {}
            Wake::Listed => {
                if last.is_none() && !warned {
                    warned = true;
                    log::warn!(
                        "admission: ValidatingWebhookConfiguration {CONFIGURATION} does not exist, so no API server calls this webhook; create it with `nodekeeper manifests --for webhook` (NodeMaintenances are checked in status meanwhile)"
                    );
                }
                continue;
            }
        }
        let Some(current) = &last else { continue };
        let mine = lock(&state.mine).clone();
        match desired(current, &mine, &state.config.identity, Timestamp::now()) {
            None => {}
            Some(patch) => match api
                .patch(
                    CONFIGURATION,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(o) => {
                    log::info!("admission: caBundle of {CONFIGURATION} carries our CA");
                    last = Some(Box::new(o));
                }
                // Someone wrote first: the watch brings their version.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    log::warn!(
                        "admission: cannot write the caBundle of ValidatingWebhookConfiguration {CONFIGURATION}: {} (retrying in 10 s)",
                        crate::error::kube_cause(&e)
                    );
                    let kick = state.kick.clone();
                    crate::runtime::spawn(async move {
                        crate::runtime::sleep(Duration::from_secs(10)).await;
                        let _ = kick.try_send(());
                    })
                    .detach();
                }
            },
        }
    }
}

/// Write the caBundle without our CAs (`state.mine` is emptied first),
/// read fresh and guarded by its resourceVersion; a conflict reads again.
/// `Ok(false)`: there was nothing of ours to take out.
pub(super) async fn withdraw(state: &State) -> Result<bool> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(state.client.clone());
    let ctx = || format!("taking our CA out of ValidatingWebhookConfiguration {CONFIGURATION}");
    let mine = lock(&state.mine).clone();
    let mut tries = 0;
    loop {
        tries += 1;
        let Some(current) = api
            .get_opt(CONFIGURATION)
            .await
            .map_err(Error::kube(ctx()))?
        else {
            return Ok(false);
        };
        let Some(patch) = desired(&current, &mine, &state.config.identity, Timestamp::now()) else {
            return Ok(false);
        };
        match api
            .patch(
                CONFIGURATION,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 && tries < 3 => continue,
            Err(e) => return Err(Error::kube(ctx())(e)),
        }
    }
}

/// The merge patch that puts `mine` into every webhook's caBundle of
/// `current`, or `None` if it already is so.
fn desired(
    current: &ValidatingWebhookConfiguration,
    mine: &[(String, Owned)],
    me: &str,
    now: Timestamp,
) -> Option<Value> {
    let owners: Vec<Owned> = current
        .annotations()
        .get(OWNERS_ANNOTATION)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default();
    let webhooks = current.webhooks.clone().unwrap_or_default();
    let mut changed = false;
    let mut out = Vec::new();
    let mut kept = owners.clone();
    for mut w in webhooks {
        let bundle = w
            .client_config
            .ca_bundle
            .as_ref()
            .map(|b| String::from_utf8_lossy(&b.0).to_string())
            .unwrap_or_default();
        let (merged, k) = admission::merge_bundle(&bundle, &owners, me, mine, now, sha256_hex);
        if merged != bundle {
            changed = true;
            w.client_config.ca_bundle = Some(k8s_openapi::ByteString(merged.into_bytes()));
        }
        kept = k;
        out.push(w);
    }
    let kept_json = serde_json::to_string(&kept).unwrap_or_default();
    if !changed && kept == owners {
        return None;
    }
    Some(json!({
        "metadata": {
            "resourceVersion": current.resource_version(),
            "annotations": {OWNERS_ANNOTATION: kept_json},
        },
        "webhooks": out,
    }))
}

/// Replace CA and certificate after two thirds of their life: publish the
/// new CA beside the old, give the API servers [`PROPAGATION`] to load it,
/// serve with the new certificate, then drop the old CA.
pub(super) async fn rotate(state: Arc<State>, mut not_before: Timestamp, mut not_after: Timestamp) {
    loop {
        let at = admission::rotate_at(not_before, not_after);
        let wait = crate::decide::duration_until(Timestamp::now(), at);
        crate::runtime::sleep(wait).await;
        let issued = match issue(&state.config, Timestamp::now()) {
            Ok(i) => i,
            Err(e) => {
                log::warn!("admission: {e}; retrying in 10 minutes");
                crate::runtime::sleep(Duration::from_secs(600)).await;
                continue;
            }
        };
        {
            let mut mine = lock(&state.mine);
            mine.insert(0, (issued.ca_pem.clone(), issued.owned.clone()));
            mine.truncate(2);
        }
        let _ = state.kick.try_send(());
        crate::runtime::sleep(PROPAGATION).await;
        *lock(&state.serving) = issued.tls.clone();
        lock(&state.mine).truncate(1);
        let _ = state.kick.try_send(());
        log::info!(
            "admission: rotated the webhook's CA and certificate (valid until {})",
            issued.not_after
        );
        (not_before, not_after) = (issued.not_before, issued.not_after);
    }
}
