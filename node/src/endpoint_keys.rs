//! The QUIC endpoint keys every life of a node shares, so that a life started after a crash
//! ends the connections its predecessor left open instead of leaving them to their idle
//! timeout.
//!
//! A packet of a connection the endpoint does not hold is answered with a stateless reset
//! (RFC 9000, 10.3) only when its connection id is one the endpoint recognizes as its own, and
//! the sender acts on the reset only when it carries the token the connection's previous life
//! announced: HMAC(reset key, connection id). quinn draws both keys at random per process, so a
//! new life took its predecessor's connection ids for strays and stayed silent. Here both are
//! derived (HKDF-SHA256) from the node's private key and its id: every life of the node has
//! them, nodes sharing one certificate still have their own, and no one without the private key
//! can make a reset a client or peer accepts.

use quinn::{ConnectionId, ConnectionIdGenerator};
use rand::Rng;
use ring::{hkdf, hmac};
use rustls::pki_types::PrivateKeyDer;

/// The keys of one node, the same in each of its lives.
pub(crate) struct LifeKeys {
    /// Signs the stateless-reset tokens.
    pub(crate) reset: hmac::Key,
    /// Makes and recognizes the node's connection ids.
    pub(crate) connection_ids: LifeConnectionIds,
}

impl LifeKeys {
    /// The keys of the node with private key `key` and id `id`.
    pub(crate) fn derive(key: &PrivateKeyDer<'_>, id: &str) -> anyhow::Result<LifeKeys> {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"floodgate QUIC endpoint keys")
            .extract(key.secret_der());
        let derive = |use_: &[u8]| -> anyhow::Result<hmac::Key> {
            let context = [use_, id.as_bytes()];
            let okm = prk
                .expand(&context, hmac::HMAC_SHA256)
                .map_err(|_| anyhow::anyhow!("deriving the QUIC endpoint's keys"))?;
            Ok(hmac::Key::from(okm))
        };
        Ok(LifeKeys {
            reset: derive(b"stateless reset ")?,
            connection_ids: LifeConnectionIds {
                key: derive(b"connection ids ")?,
            },
        })
    }
}

/// Random bytes in a connection id. Lives sharing a key must not issue an id again whose reset
/// token an earlier life may have revealed (RFC 9000, 10.3.2). quinn's keyed ids carry 3 random
/// bytes, which a node's lives would repeat within a few thousand connections; with 5, n ids
/// issued over all of a node's lives repeat one with a chance of about n² / 2^41.
const NONCE_BYTES: usize = 5;
/// Bytes of the id's tag: the endpoint drops all but one in 2^24 stray datagrams without a
/// reset. The format is ours, so an upgrade of quinn cannot change it between two lives.
const TAG_BYTES: usize = 3;

/// Connection ids of [`NONCE_BYTES`] random bytes and [`TAG_BYTES`] of their HMAC under a key
/// the node's lives share: 8 bytes, as quinn's own.
#[derive(Clone)]
pub(crate) struct LifeConnectionIds {
    key: hmac::Key,
}

impl LifeConnectionIds {
    fn id_of(&self, nonce: [u8; NONCE_BYTES]) -> ConnectionId {
        let mut id = [0u8; NONCE_BYTES + TAG_BYTES];
        id[..NONCE_BYTES].copy_from_slice(&nonce);
        id[NONCE_BYTES..].copy_from_slice(&self.tag(&nonce));
        ConnectionId::new(&id)
    }

    fn tag(&self, nonce: &[u8]) -> [u8; TAG_BYTES] {
        let mut tag = [0u8; TAG_BYTES];
        tag.copy_from_slice(&hmac::sign(&self.key, nonce).as_ref()[..TAG_BYTES]);
        tag
    }
}

impl ConnectionIdGenerator for LifeConnectionIds {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rng().fill_bytes(&mut nonce);
        self.id_of(nonce)
    }

    fn validate(&self, id: &ConnectionId) -> Result<(), quinn_proto::InvalidCid> {
        match id.len() == NONCE_BYTES + TAG_BYTES
            && id[NONCE_BYTES..] == self.tag(&id[..NONCE_BYTES])
        {
            true => Ok(()),
            false => Err(quinn_proto::InvalidCid),
        }
    }

    fn cid_len(&self) -> usize {
        NONCE_BYTES + TAG_BYTES
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::PrivatePkcs8KeyDer;

    /// Key bytes as a PEM file gives them (the derivation reads them, never parses them).
    fn private_key(byte: u8) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(vec![byte; 64]))
    }

    /// What one life's reset key signs, and one of its connection ids.
    fn life(key: u8, id: &str) -> (Vec<u8>, LifeConnectionIds) {
        let keys = LifeKeys::derive(&private_key(key), id).unwrap();
        let token = hmac::sign(&keys.reset, b"a connection id")
            .as_ref()
            .to_vec();
        (token, keys.connection_ids)
    }

    #[test]
    fn every_life_of_a_node_shares_its_keys_and_no_other_node_does() {
        let (token, ids) = life(1, "10.0.0.1:7100");
        let id = ids.id_of([1, 2, 3, 4, 5]);
        let (next_token, next_ids) = life(1, "10.0.0.1:7100");
        assert_eq!(
            next_token, token,
            "the next life signs the same reset tokens"
        );
        assert!(next_ids.validate(&id).is_ok(), "and knows the ids");
        for (other_token, other_ids) in [life(1, "10.0.0.2:7100"), life(2, "10.0.0.1:7100")] {
            assert_ne!(other_token, token, "another node's reset tokens");
            assert!(other_ids.validate(&id).is_err(), "another node's ids");
        }
    }

    #[test]
    fn ids_are_eight_bytes_and_only_a_tagged_one_is_recognized() {
        let (_, mut ids) = life(1, "fg-a.internal");
        let id = ids.generate_cid();
        assert_eq!((id.len(), ids.cid_len()), (8, 8));
        assert!(ids.validate(&id).is_ok());
        let mut forged = id.to_vec();
        forged[7] ^= 1;
        assert!(
            ids.validate(&ConnectionId::new(&forged)).is_err(),
            "a wrong tag"
        );
        assert!(
            ids.validate(&ConnectionId::new(&id[..7])).is_err(),
            "a short id"
        );
    }
}
