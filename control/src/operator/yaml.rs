//! Multi-document YAML.
