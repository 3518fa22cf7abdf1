//! The region settings of a rules file: `regions:` (the deployment's regions), `tenants:`
//! (tenant → home region) and a rule's `scope:` (region, global, home or home:REGION), each
//! region checked against `regions:`.

use std::collections::HashMap;

use super::error::PolicyError;
use super::rules::RuleScope;
use super::yaml::{self, Node, error_at};
use crate::region::RegionName;

/// Most regions a rules file may declare.
pub const MAX_REGIONS: usize = 64;
/// Most entries in the `tenants:` table.
pub const MAX_TENANTS: usize = 100_000;

/// `regions: [eu, us, ap]`: valid, distinct names.
pub(super) fn parse_regions(node: &Node<'_>) -> Result<Vec<RegionName>, PolicyError> {
    let mut regions: Vec<RegionName> = Vec::new();
    let items = yaml::strings(node, "`regions`")?;
    if items.len() > MAX_REGIONS {
        return Err(error_at(
            node,
            format!("{} regions; the maximum is {MAX_REGIONS}", items.len()),
        ));
    }
    for (text, item) in items {
        let region = RegionName::new(text).map_err(|e| error_at(item, e.to_string()))?;
        if regions.contains(&region) {
            return Err(error_at(item, format!("region `{text}` is listed twice")));
        }
        regions.push(region);
    }
    Ok(regions)
}

/// A region named in the file: valid and declared under `regions:`.
fn known_region(
    node: &Node<'_>,
    text: &str,
    regions: &[RegionName],
) -> Result<RegionName, PolicyError> {
    let region = RegionName::new(text).map_err(|e| error_at(node, e.to_string()))?;
    if regions.contains(&region) {
        return Ok(region);
    }
    let declared = if regions.is_empty() {
        "none; list them under `regions:`".to_owned()
    } else {
        regions
            .iter()
            .map(RegionName::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(error_at(
        node,
        format!("unknown home region `{text}` (declared regions: {declared})"),
    ))
}

/// `tenants: { acme: eu, globex: us }`: each tenant's home region, a declared one.
pub(super) fn parse_tenants(
    node: &Node<'_>,
    regions: &[RegionName],
) -> Result<HashMap<String, RegionName>, PolicyError> {
    let entries = yaml::mapping(node, "`tenants` (tenant: home region)")?;
    if entries.len() > MAX_TENANTS {
        return Err(error_at(
            node,
            format!("{} tenants; the maximum is {MAX_TENANTS}", entries.len()),
        ));
    }
    let mut tenants = HashMap::with_capacity(entries.len());
    for (tenant, key_node, value) in entries {
        if tenant.is_empty() {
            return Err(error_at(key_node, "a tenant cannot be empty"));
        }
        let text = yaml::string(value, "a tenant's home region")?;
        tenants.insert(tenant.to_owned(), known_region(value, text, regions)?);
    }
    Ok(tenants)
}

/// A rule's `scope:`: `region` (the default), `global`, `home` (the request's home region) or
/// `home:REGION` (a declared region).
pub(super) fn parse_scope(
    node: &Node<'_>,
    regions: &[RegionName],
) -> Result<RuleScope, PolicyError> {
    let text = yaml::string(node, "`scope` (region, global, home or home:REGION)")?;
    match text {
        "region" => Ok(RuleScope::Region),
        "global" => Ok(RuleScope::Global),
        "home" => Ok(RuleScope::RequestHome),
        _ => match text.strip_prefix("home:") {
            Some(region) => Ok(RuleScope::Home(known_region(node, region, regions)?)),
            None => Err(error_at(
                node,
                format!("unknown scope `{text}`: expected region, global, home or home:REGION"),
            )),
        },
    }
}
