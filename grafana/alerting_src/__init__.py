"""The provisioned alerting: settings, rules, contact points and the notification policy."""
