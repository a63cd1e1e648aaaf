"""(placeholder: this command group has not landed yet)"""
