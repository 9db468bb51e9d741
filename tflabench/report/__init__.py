"""What a reader sees: rich tables, matplotlib figures and the HTML report, drawn from result sets."""
