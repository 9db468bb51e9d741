from tflabench.cli import main

main()
