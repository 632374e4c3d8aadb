//! The consumer's side of Liqo's authentication handshake, as `liqoctl authenticate` does
//! it (liqotech/liqo `pkg/liqo-controller-manager/authentication/utils/tenant.go`,
//! `GenerateTenant`; `authentication/keys.go`, `GetClusterKeys`; `authentication/csr.go`,
//! `GenerateCSRForControlPlane`): from the consumer's authentication keys, a CSR for
//! common name = its cluster id and organization `liqo.io`, signed with its private key;
//! with its public key and the nonce signature Liqo's nonce signer made, the Tenant's
//! spec. The private key is read, used and dropped here; it never leaves this module.

use ferry_kube::vocab::liqo::CONTROL_PLANE_ORGANIZATION;

use crate::liqo::Handshake;

/// Why the consumer's keys could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The keys Secret lacks a field.
    #[error("the authentication keys Secret has no {0} field")]
    Missing(&'static str),
    /// The private key is not a PKCS #8 PEM key rcgen can sign with.
    #[error("the cluster's private key cannot be used: {0}")]
    Key(String),
}

/// The Tenant's handshake of the consumer `consumer_id`, from its keys Secret's
/// `privateKey` and `publicKey` fields and the nonce `signature`.
pub fn handshake(consumer_id: &str, private_pem: Option<&[u8]>, public_pem: Option<&[u8]>, signature: Vec<u8>) -> Result<Handshake, HandshakeError> {
    let private = std::str::from_utf8(private_pem.ok_or(HandshakeError::Missing("privateKey"))?).map_err(|e| HandshakeError::Key(e.to_string()))?;
    let public_key = public_pem.ok_or(HandshakeError::Missing("publicKey"))?.to_vec();
    let kp = rcgen::KeyPair::from_pem(private).map_err(|e| HandshakeError::Key(e.to_string()))?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, consumer_id);
    params.distinguished_name.push(rcgen::DnType::OrganizationName, CONTROL_PLANE_ORGANIZATION);
    let csr = params.serialize_request(&kp).and_then(|r| r.pem()).map_err(|e| HandshakeError::Key(e.to_string()))?;
    Ok(Handshake { public_key, csr: csr.into_bytes(), signature })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_csr_is_made_with_the_consumers_key_and_errors_name_no_secret() {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let h = handshake("member-1", Some(kp.serialize_pem().as_bytes()), Some(kp.public_key_pem().as_bytes()), vec![1, 2]).unwrap();
        assert!(String::from_utf8(h.csr).unwrap().starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        let e = handshake("member-1", Some(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), Some(b"pk"), vec![]).unwrap_err();
        assert!(!e.to_string().contains("AAAA"), "{e}");
        assert!(matches!(handshake("member-1", None, Some(b"pk"), vec![]), Err(HandshakeError::Missing("privateKey"))));
    }
}
