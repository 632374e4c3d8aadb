//! `authentication` (and `authentication-reverse`): `liqoctl authenticate`
//! (liqotech/liqo `pkg/liqoctl/authenticate/handler.go`, `RunAuthenticate`) for one
//! direction, with the real key exchange:
//! 1. the nonce Secret on the provider, filled by Liqo's nonce creator (`EnsureNonce`);
//! 2. the signed-nonce Secret on the consumer with that nonce, signed by Liqo's nonce
//!    signer with the consumer's key (`EnsureSignedNonce`);
//! 3. the Tenant on the provider with the consumer's public key, a CSR for its control
//!    plane and the signature ([`crate::handshake`], `GenerateTenant`); waits until the
//!    provider's tenant controller verified it and issued the certificate
//!    (`status.authParams`) — a refusal Liqo records on the Tenant (a wrong signature, a
//!    CSR not for the consumer's key, no nonce) fails the step with Liqo's reason;
//! 4. the Identity on the consumer from the Tenant's status (`GenerateIdentity`,
//!    `EnsureIdentity`); waits until Liqo made its kubeconfig.
//!
//! Nonce, signature, keys and certificate never appear in an output, event or error.
//! Undo deletes the four objects (the pair's own only) and waits until no Identity is left.

use std::sync::Arc;

use ferry_kube::Check;
use ferry_kube::step_errors::wait_err;
use ferry_kube::vocab::liqo::{AUTH_KEYS_SECRET, NONCE_FIELD, NONCE_SECRET, SIGNED_NONCE_FIELD, SIGNED_NONCE_SECRET};
use ferry_task::{Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Event, Secret};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::liqo_check::IDS;
use super::{LiqoIdentity, LiqoTenant, Roles, none_left, roles};
use crate::handler::Inner;
use crate::liqo;
use crate::spec::PeerClusters;

/// The `authentication` step's output.
pub const AUTHENTICATION: Output<Authenticated> = Output::new("authentication");
/// The `authentication-reverse` step's output (bidirectional peerings).
pub const AUTHENTICATION_REVERSE: Output<Authenticated> = Output::new("authentication-reverse");

/// Output of `authentication`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Authenticated {
    /// The cluster that holds the Identity.
    pub consumer: String,
}

/// Authentication of a direction's consumer on its provider.
pub(crate) struct Authentication {
    inner: Arc<Inner>,
    policy: StepPolicy,
    /// The direction `b` → `a`.
    reverse: bool,
}

impl Authentication {
    pub(crate) fn new(inner: &Arc<Inner>, policy: StepPolicy, reverse: bool) -> Self {
        Self { inner: inner.clone(), policy, reverse }
    }

    fn key(&self) -> Output<Authenticated> {
        if self.reverse { AUTHENTICATION_REVERSE } else { AUTHENTICATION }
    }

    /// Waits until the Secret `name` in `cluster`'s tenant namespace toward the remote has
    /// `field`; its value (never shown).
    async fn secret_field(&self, cluster: &str, to: &liqo::Toward, name: &str, field: &'static str, what: &str, timeout: std::time::Duration) -> Result<Vec<u8>, StepError> {
        let client = self.inner.client(cluster).await?;
        self.inner
            .cfg
            .watches
            .wait_object::<Secret, Vec<u8>>(cluster, &client, Some(&to.namespace), name, timeout, |s| {
                match s.and_then(|s| s.data.as_ref()).and_then(|d| d.get(field)).filter(|v| !v.0.is_empty()) {
                    Some(v) => Check::Done(v.0.clone()),
                    None => Check::Pending(format!("Liqo has not written the {what} yet")),
                }
            })
            .await
            .map_err(|e| wait_err(codes::AUTHENTICATION, e))
    }

    /// Steps 1 and 2: the provider's nonce, signed on the consumer; (nonce, signature).
    async fn nonce(&self, r: &Roles, pair: &str, timeout: std::time::Duration) -> Result<(Vec<u8>, Vec<u8>), StepError> {
        self.inner.apply(&r.provider, &liqo::nonce_secret(&r.at_provider, pair)).await?;
        let nonce = self.secret_field(&r.provider, &r.at_provider, NONCE_SECRET, NONCE_FIELD, "nonce", timeout).await?;
        // A signed-nonce Secret for another nonce (the provider's was made again) would keep
        // its stale signature: it is replaced (`EnsureSignedNonceSecret` refuses it).
        let signed = liqo::signed_nonce_secret(&r.at_consumer, &nonce, pair);
        if let Ok(Some(old)) = self.inner.cfg.clusters.get(&r.consumer, &signed).await
            && old.data.pointer(&format!("/data/{NONCE_FIELD}")).and_then(Value::as_str) != signed.pointer(&format!("/data/{NONCE_FIELD}")).and_then(Value::as_str)
        {
            self.inner.delete_own(&r.consumer, &signed, pair).await?;
            let client = self.inner.client(&r.consumer).await?;
            self.inner
                .cfg
                .watches
                .wait_deleted::<Secret>(&r.consumer, &client, Some(&r.at_consumer.namespace), SIGNED_NONCE_SECRET, timeout)
                .await
                .map_err(|e| wait_err(codes::AUTHENTICATION, e))?;
        }
        self.inner.apply(&r.consumer, &signed).await?;
        let signature = self.secret_field(&r.consumer, &r.at_consumer, SIGNED_NONCE_SECRET, SIGNED_NONCE_FIELD, "nonce signature", timeout).await?;
        Ok((nonce, signature))
    }

    /// The consumer's keys (its `liqo/authentication-keys` Secret): (private, public) PEM.
    async fn keys(&self, r: &Roles) -> Result<(Option<Vec<u8>>, Option<Vec<u8>>), StepError> {
        let client = self.inner.client(&r.consumer).await?;
        let s = kube::Api::<Secret>::namespaced(client, liqo::LIQO_NAMESPACE).get_opt(AUTH_KEYS_SECRET).await.map_err(|e| {
            StepError::transient(codes::CLUSTER_API, format!("reading {}/{AUTH_KEYS_SECRET} on {}: {e}", liqo::LIQO_NAMESPACE, r.consumer))
        })?;
        let s = s.ok_or_else(|| StepError::permanent(codes::LIQO_NOT_READY, format!("{} has no Secret {}/{AUTH_KEYS_SECRET}: Liqo made no cluster keys", r.consumer, liqo::LIQO_NAMESPACE)))?;
        let d = s.data.unwrap_or_default();
        Ok((d.get("privateKey").map(|k| k.0.clone()), d.get("publicKey").map(|k| k.0.clone())))
    }

    /// Step 3's wait: the Tenant's auth params and tenant namespace, or Liqo's refusal.
    async fn accepted(&self, r: &Roles, uid: Option<String>, timeout: std::time::Duration) -> Result<(Value, String), StepError> {
        let client = self.inner.client(&r.provider).await?;
        let ns = &r.at_provider.namespace;
        let status = self.inner.cfg.watches.wait_object::<LiqoTenant, (Value, String)>(&r.provider, &client, Some(ns), &r.consumer_id, timeout, |t| {
            let Some(t) = t else { return Check::Pending("no Tenant".into()) };
            match (t.status_at("/authParams").filter(|a| a.get("signedCRT").is_some()), t.status_at("/tenantNamespace").and_then(Value::as_str)) {
                (Some(a), Some(n)) => Check::Done((a.clone(), n.to_owned())),
                _ => Check::Pending("the provider has not accepted the Tenant yet".into()),
            }
        });
        // A refusal is a Warning event on this Tenant (`verifyHandshake`): watched alongside.
        let refused = self.inner.cfg.watches.wait_store::<Event, String>(&r.provider, &client, Some(ns), "Liqo's verdict on the Tenant", timeout + std::time::Duration::from_secs(60), |s| {
            let hit = s.state().into_iter().find(|e| {
                e.involved_object.kind.as_deref() == Some("Tenant")
                    && e.involved_object.name.as_deref() == Some(r.consumer_id.as_str())
                    && e.type_.as_deref() == Some("Warning")
                    && uid.as_deref().is_none_or(|u| e.involved_object.uid.as_deref() == Some(u))
                    && matches!(e.reason.as_deref(), Some("SignatureVerificationFailed" | "InvalidCSR" | "NonceNotFound"))
            });
            match hit {
                Some(e) => Check::Done(format!("{}: {}", e.reason.clone().unwrap_or_default(), e.message.clone().unwrap_or_default())),
                None => Check::Pending("no refusal".into()),
            }
        });
        tokio::select! {
            done = status => done.map_err(|e| wait_err(codes::AUTHENTICATION, e)),
            why = refused => match why {
                Ok(why) => Err(StepError::permanent(codes::AUTHENTICATION, format!("{} refused the Tenant of {}: {why}", r.provider, r.consumer))),
                Err(e) => Err(wait_err(codes::AUTHENTICATION, e)),
            },
        }
    }
}

impl Step<PeerClusters> for Authentication {
    fn name(&self) -> &str {
        self.key().step()
    }

    fn policy(&self) -> StepPolicy {
        self.policy.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let (p, ids) = (cx.spec, IDS.required(cx)?);
            let pair = liqo::pair_label(&p.a, &p.b);
            let r = roles(p, &ids, self.reverse);
            let (_nonce, signature) = self.nonce(&r, &pair, p.timeout()).await?;
            cx.progress(25, format!("nonce of {} signed by {}", r.provider, r.consumer));
            let (private, public) = self.keys(&r).await?;
            let h = crate::handshake::handshake(&r.consumer_id, private.as_deref(), public.as_deref(), signature)
                .map_err(|e| StepError::permanent(codes::AUTHENTICATION, format!("{}'s authentication keys: {e}", r.consumer)))?;
            let tenant = self.inner.apply_obj(&r.provider, &liqo::tenant(&r.at_provider, &h, &pair)).await?;
            cx.progress(50, format!("Tenant {} on {}", r.consumer_id, r.provider));
            let (auth_params, tenant_ns) = self.accepted(&r, tenant.metadata.uid.clone(), p.timeout()).await?;
            self.inner.apply(&r.consumer, &liqo::identity(&r.at_consumer, &auth_params, &tenant_ns, &pair)).await?;
            cx.progress(75, format!("Identity toward {} on {}", r.provider_id, r.consumer));
            let client = self.inner.client(&r.consumer).await?;
            self.inner
                .cfg
                .watches
                .wait_object::<LiqoIdentity, ()>(
                    &r.consumer,
                    &client,
                    Some(&r.at_consumer.namespace),
                    &liqo::identity_name(&r.provider_id),
                    p.timeout(),
                    |i| match i.and_then(|i| i.status_at("/kubeconfigSecretRef/name")) {
                        Some(_) => Check::Done(()),
                        None => Check::Pending("Liqo has not made the Identity's kubeconfig yet".into()),
                    },
                )
                .await
                .map_err(|e| wait_err(codes::AUTHENTICATION, e))?;
            cx.progress(100, format!("{} authenticated on {}", r.consumer, r.provider));
            self.key().value(&Authenticated { consumer: r.consumer })
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let (p, ids) = (cx.spec, IDS.required(cx)?);
            let pair = liqo::pair_label(&p.a, &p.b);
            let r = roles(p, &ids, self.reverse);
            self.inner.delete_own(&r.consumer, &liqo::identity(&r.at_consumer, &Value::Null, "", &pair), &pair).await?;
            self.inner.delete_own(&r.provider, &liqo::tenant(&r.at_provider, &liqo::Handshake::default(), &pair), &pair).await?;
            self.inner.delete_own(&r.consumer, &liqo::signed_nonce_secret(&r.at_consumer, &[], &pair), &pair).await?;
            self.inner.delete_own(&r.provider, &liqo::nonce_secret(&r.at_provider, &pair), &pair).await?;
            none_left::<LiqoIdentity>(&self.inner, &r.consumer, &r.at_consumer, "identities").await?;
            cx.progress(100, format!("{} no longer authenticated on {}", r.consumer, r.provider));
            Ok(())
        }
        .boxed()
    }
}

