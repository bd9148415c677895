"""Who may see what: namespace visibility (grants or the clusters' own RBAC), and the audit trail."""
