from testbed.cli import program

program()
