"""What an operator and a monitoring system see: status, verify, the Prometheus textfile."""
