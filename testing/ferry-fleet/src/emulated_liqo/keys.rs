//! The cryptography of Liqo's authentication handshake, as the emulated controllers need
//! it (liqotech/liqo `pkg/liqo-controller-manager/authentication/{keys,csr}.go`): a
//! cluster's Ed25519 key pair (PKCS #8 and PKIX PEM, `GenerateEd25519Keys`), a nonce and
//! its signature (`SignNonce`, `VerifyNonce`), and the checks a provider runs on a
//! consumer's CSR (`CheckCSRForControlPlane`, `CheckCSRForResourceSlice`: common name,
//! organization, and the CSR's key equal to the Tenant's public key).

use base64::Engine;
use rcgen::{KeyPair, PKCS_ED25519, SigningKey};
use sha2::{Digest, Sha256};
use x509_parser::prelude::FromDer;

/// Why a handshake artefact was refused; the messages are upstream's where it has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// Not a PEM "PUBLIC KEY" holding an Ed25519 PKIX key.
    #[error("failed to parse public key: {0}")]
    PublicKey(String),
    /// The signature does not verify with the Tenant's public key over the nonce.
    #[error("signature verification failed")]
    Signature,
    /// Not one PEM CSR (upstream: "invalid CSR").
    #[error("invalid CSR")]
    Csr,
    /// The CSR's common name is not the one expected.
    #[error("invalid common name")]
    CommonName,
    /// The CSR's organization is not the one expected.
    #[error("invalid organization")]
    Organization,
    /// The CSR is not for the Tenant's public key.
    #[error("invalid public key")]
    CsrKey,
    /// A key could not be made or read.
    #[error("cluster keys: {0}")]
    Keys(String),
}

/// A cluster's authentication keys: (private PKCS #8 PEM, public PKIX PEM).
pub fn generate() -> Result<(String, String), HandshakeError> {
    let kp = KeyPair::generate_for(&PKCS_ED25519).map_err(|e| HandshakeError::Keys(e.to_string()))?;
    Ok((kp.serialize_pem(), kp.public_key_pem()))
}

/// A fresh nonce as the nonce creator makes it: 64 random bytes, base64 (`generateNonce`).
pub fn nonce() -> Result<String, HandshakeError> {
    let mut bytes = [0u8; 64];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(|_| HandshakeError::Keys("no randomness".into()))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Signs `nonce` (its bytes as stored) with the private key `private_pem` (`SignNonce`).
pub fn sign(private_pem: &str, nonce: &[u8]) -> Result<Vec<u8>, HandshakeError> {
    let kp = KeyPair::from_pem(private_pem).map_err(|e| HandshakeError::Keys(e.to_string()))?;
    kp.sign(nonce).map_err(|e| HandshakeError::Keys(e.to_string()))
}

/// The DER of a PEM "PUBLIC KEY" (`ParseTenantPublicKey`).
pub fn public_key_der(pem: &[u8]) -> Result<Vec<u8>, HandshakeError> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem).map_err(|e| HandshakeError::PublicKey(e.to_string()))?;
    if p.label != "PUBLIC KEY" {
        return Err(HandshakeError::PublicKey(format!("a PEM {:?} block, not PUBLIC KEY", p.label)));
    }
    Ok(p.contents)
}

/// Verifies `signature` over `nonce` with the PEM public key `public_pem` (`VerifyNonce`).
pub fn verify(public_pem: &[u8], nonce: &[u8], signature: &[u8]) -> Result<(), HandshakeError> {
    let der = public_key_der(public_pem)?;
    let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&der).map_err(|e| HandshakeError::PublicKey(e.to_string()))?;
    let key = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, spki.subject_public_key.data.as_ref());
    key.verify(nonce, signature).map_err(|_| HandshakeError::Signature)
}

/// The common name of a ResourceSlice's CSR: `<slice>-<first 6 bytes of sha256(consumer id), hex>`
/// (`CommonNameResourceSliceCSR`).
pub fn resource_slice_common_name(slice: &str, consumer_id: &str) -> String {
    let h = Sha256::digest(consumer_id.as_bytes());
    let hex: String = h[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{slice}-{hex}")
}

/// A CSR for `common_name` in `organization`, signed by `private_pem`
/// (`generateCSR`; the local ResourceSlice controller makes one per slice).
pub fn csr(private_pem: &str, common_name: &str, organization: &str) -> Result<String, HandshakeError> {
    let kp = KeyPair::from_pem(private_pem).map_err(|e| HandshakeError::Keys(e.to_string()))?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
    params.distinguished_name.push(rcgen::DnType::OrganizationName, organization);
    params.serialize_request(&kp).and_then(|r| r.pem()).map_err(|e| HandshakeError::Keys(e.to_string()))
}

/// Checks a PEM CSR as `checkCSR` does: one PEM block, the common name and organization
/// expected, and (when `public_key_der` is given) the CSR's key equal to it.
pub fn check_csr(csr_pem: &[u8], common_name: &str, organization: &str, public_key_der: Option<&[u8]>) -> Result<(), HandshakeError> {
    let (rest, p) = x509_parser::pem::parse_x509_pem(csr_pem).map_err(|_| HandshakeError::Csr)?;
    if !rest.iter().all(u8::is_ascii_whitespace) {
        return Err(HandshakeError::Csr);
    }
    let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&p.contents).map_err(|_| HandshakeError::Csr)?;
    let info = &req.certification_request_info;
    let cn = info.subject.iter_common_name().next().and_then(|a| a.as_str().ok());
    if cn != Some(common_name) {
        return Err(HandshakeError::CommonName);
    }
    let o = info.subject.iter_organization().next().and_then(|a| a.as_str().ok());
    if o != Some(organization) {
        return Err(HandshakeError::Organization);
    }
    if let Some(want) = public_key_der
        && info.subject_pki.raw != want
    {
        return Err(HandshakeError::CsrKey);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_nonce_and_a_csr_pass_only_with_the_right_key() {
        let (private, public) = generate().unwrap();
        let (other_private, other_public) = generate().unwrap();
        let n = nonce().unwrap();
        let sig = sign(&private, n.as_bytes()).unwrap();
        verify(public.as_bytes(), n.as_bytes(), &sig).unwrap();
        assert_eq!(verify(other_public.as_bytes(), n.as_bytes(), &sig), Err(HandshakeError::Signature));
        assert_eq!(verify(public.as_bytes(), b"another nonce", &sig), Err(HandshakeError::Signature));

        let der = public_key_der(public.as_bytes()).unwrap();
        let req = csr(&private, "member-1", "liqo.io").unwrap();
        check_csr(req.as_bytes(), "member-1", "liqo.io", Some(&der)).unwrap();
        assert_eq!(check_csr(req.as_bytes(), "member-2", "liqo.io", Some(&der)), Err(HandshakeError::CommonName));
        assert_eq!(check_csr(req.as_bytes(), "member-1", "other", Some(&der)), Err(HandshakeError::Organization));
        let foreign = csr(&other_private, "member-1", "liqo.io").unwrap();
        assert_eq!(check_csr(foreign.as_bytes(), "member-1", "liqo.io", Some(&der)), Err(HandshakeError::CsrKey));
        assert_eq!(check_csr(b"not a csr", "member-1", "liqo.io", None), Err(HandshakeError::Csr));
        assert_eq!(resource_slice_common_name("member-2", "member-1").len(), "member-2-".len() + 12);
    }
}
